//! The lifecycle commands: `campaign cancel`, `set-start`, `set-expiry` and `events`.

use super::{decode, pretty, put_campaign, CampaignOut, Changed, CliError, Client};
use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};

/// An instant as the API takes it: `none` clears it; digits are unix seconds; anything
/// else goes as RFC 3339 text (the API checks it and names the field).
pub(super) fn instant_value(raw: &str) -> serde_json::Value {
    match raw {
        "none" | "null" => serde_json::Value::Null,
        s if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() => s
            .parse::<u64>()
            .map_or_else(|_| s.into(), serde_json::Value::from),
        s => s.into(),
    }
}

/// Asks before cancelling, unless `--yes`. Without a terminal to ask on, refuses.
fn confirm(id: &str) -> Result<(), CliError> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::Invalid(
            "cancel is final: confirm with --yes (no terminal to ask on)".into(),
        ));
    }
    print!(
        "Cancel campaign {id}? Its unsent devices are never sent; this cannot be undone. [y/N] "
    );
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    let _ = stdin.lock().read_line(&mut answer);
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(CliError::Invalid("not cancelled".into()))
    }
}

pub(super) async fn cancel(
    client: &Client,
    id: &str,
    yes: bool,
    json: bool,
) -> Result<String, CliError> {
    if !yes {
        confirm(id)?;
    }
    let url = format!("{}/cancel", client.campaign_url(id));
    let bytes = client
        .call(reqwest::Method::POST, url.clone(), None, true)
        .await?;
    if json {
        return pretty(&url, &bytes);
    }
    let c: CampaignOut = decode(&url, &bytes)?;
    Ok(format!(
        "campaign {}: {}; its unsent devices are counted cancelled\n",
        c.id, c.status
    ))
}

/// `set-start` / `set-expiry`: `field` is start_at or expires_at.
pub(super) async fn set_instant(
    client: &Client,
    id: &str,
    field: &str,
    raw: &str,
    json: bool,
) -> Result<String, CliError> {
    let body = serde_json::json!({ field: instant_value(raw) });
    let c = match put_campaign(client, id, body, json).await? {
        Changed::Json(text) => return Ok(text),
        Changed::Campaign(c) => c,
    };
    let value = match field {
        "start_at" => c.start_at,
        _ => c.expires_at,
    };
    Ok(format!(
        "campaign {}: {field} {}; the worker applies it within a second\n",
        c.id,
        value.map_or_else(|| "none".into(), |t| t.to_rfc3339())
    ))
}

#[derive(Debug, serde::Deserialize)]
struct EventOut {
    at: chrono::DateTime<chrono::Utc>,
    actor: String,
    field: String,
    old: Option<String>,
    new: Option<String>,
}

pub(super) async fn events(client: &Client, id: &str, json: bool) -> Result<String, CliError> {
    let url = format!("{}/events", client.campaign_url(id));
    let bytes = client
        .call(reqwest::Method::GET, url.clone(), None, false)
        .await?;
    if json {
        return pretty(&url, &bytes);
    }
    let list: Vec<EventOut> = decode(&url, &bytes)?;
    let mut out = String::new();
    for e in list {
        let _ = writeln!(
            out,
            "{}  {:<10}  {:<10}  {} → {}",
            e.at.format("%Y-%m-%d %H:%M:%S"),
            e.actor,
            e.field,
            e.old.as_deref().unwrap_or("-"),
            e.new.as_deref().unwrap_or("-")
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_go_as_the_api_takes_them() {
        assert_eq!(instant_value("none"), serde_json::Value::Null);
        assert_eq!(
            instant_value("1800000000"),
            serde_json::json!(1_800_000_000u64)
        );
        assert_eq!(
            instant_value("2026-11-25T10:00:00Z"),
            serde_json::json!("2026-11-25T10:00:00Z")
        );
    }
}
