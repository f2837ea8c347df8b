//! `pushpace apps list|show|put|check|disable|enable|delete`: thin clients of `/api/apps`
//! (every call with the admin token), and `pushpace apps rotate-master-key`, which
//! re-seals the registry's rows directly in the database with `[apps]`' keys.
//!
//! `put` reads the secrets from files (`--apns-key`, `--fcm-service-account`,
//! `--vapid-key`) or a whole body from `--body FILE`; nothing printed here holds a
//! secret: the API answers with fingerprints.

use super::client::{decode, pretty, Client};
use super::render::table;
use super::{ApiArgs, CliError, OutputFormat};
use crate::config::Settings;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct AppsArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    pub command: AppsCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum AppsCommand {
    /// Every app: its status and each kind's fingerprint (no secret).
    List,
    /// One app.
    Show { id: String },
    /// Creates or replaces an app: its kinds become exactly those given.
    Put(Box<PutArgs>),
    /// Each kind's authentication round trip with the app's credentials (as
    /// `providers check`); exits non-zero if one fails.
    Check { id: String },
    /// Stops every kind of an app from sending.
    Disable { id: String },
    /// Lets an app send again; also ends a halt (fix its credentials first).
    Enable { id: String },
    /// Deletes an app; refused while campaigns send through it unless --force.
    Delete {
        id: String,
        #[arg(long)]
        force: bool,
    },
    /// Re-seals every row under the current master key (apps.master_key_file or
    /// PUSHPACE__APPS__MASTER_KEY), opening them with apps.old_master_key_files. Safe
    /// while workers run; a second run does nothing.
    RotateMasterKey,
}

#[derive(Args, Debug, Clone)]
pub struct PutArgs {
    pub id: String,
    /// The whole PUT body as a JSON file; the flags below add to it.
    #[arg(long, value_name = "FILE")]
    pub body: Option<PathBuf>,
    /// The APNs `.p8` key (PKCS#8 PEM).
    #[arg(long, value_name = "FILE")]
    pub apns_key: Option<PathBuf>,
    #[arg(long, requires = "apns_key")]
    pub apns_key_id: Option<String>,
    #[arg(long, requires = "apns_key")]
    pub apns_team_id: Option<String>,
    /// The bundle id.
    #[arg(long, requires = "apns_key")]
    pub apns_topic: Option<String>,
    /// production or sandbox.
    #[arg(long, requires = "apns_key", default_value = "production")]
    pub apns_environment: String,
    #[arg(long, requires = "apns_key")]
    pub apns_endpoint: Option<String>,
    /// The Firebase service-account JSON file.
    #[arg(long, value_name = "FILE")]
    pub fcm_service_account: Option<PathBuf>,
    /// Over https://fcm.googleapis.com: a private gateway.
    #[arg(long, requires = "fcm_service_account")]
    pub fcm_endpoint: Option<String>,
    /// The VAPID private key (P-256 PEM).
    #[arg(long, value_name = "FILE")]
    pub vapid_key: Option<PathBuf>,
    /// mailto: or https: (RFC 8292).
    #[arg(long, requires = "vapid_key")]
    pub vapid_subject: Option<String>,
}

/// Runs an `apps` subcommand and returns what to print.
pub async fn run_apps(args: &AppsArgs, settings: &Settings) -> Result<String, CliError> {
    if let AppsCommand::RotateMasterKey = args.command {
        return rotate(settings, args.api.format == OutputFormat::Json).await;
    }
    let client = Client::new(&args.api, settings)?;
    let json = args.api.format == OutputFormat::Json;
    let (method, url, body) = match &args.command {
        AppsCommand::List => (Method::GET, format!("{}/api/apps", client.base), None),
        AppsCommand::Show { id } => (Method::GET, client.app_url(id), None),
        AppsCommand::Put(p) => (Method::PUT, client.app_url(&p.id), Some(put_body(p)?)),
        AppsCommand::Disable { id } => (Method::POST, client.app_url(id) + "/disable", None),
        AppsCommand::Enable { id } => (Method::POST, client.app_url(id) + "/enable", None),
        AppsCommand::Check { id } => (Method::POST, client.app_url(id) + "/check", None),
        AppsCommand::Delete { id, force } => {
            let url = client.app_url(id) + if *force { "?force=true" } else { "" };
            (Method::DELETE, url, None)
        }
        AppsCommand::RotateMasterKey => unreachable!("answered above"),
    };
    let bytes = client.call(method, url.clone(), body, true).await?;
    if json {
        return pretty(&url, &bytes);
    }
    match &args.command {
        AppsCommand::List => Ok(apps_table(&decode::<Vec<Value>>(&url, &bytes)?)),
        AppsCommand::Delete { id, .. } => Ok(format!("app {id} deleted\n")),
        AppsCommand::Check { .. } => check_report(&decode(&url, &bytes)?),
        _ => Ok(app_details(&decode(&url, &bytes)?)),
    }
}

/// One line per kind; an error (so a non-zero exit) when one failed.
fn check_report(answer: &Value) -> Result<String, CliError> {
    let mut out = String::new();
    for k in answer["kinds"].as_array().into_iter().flatten() {
        let verdict = if k["ok"] == Value::Bool(true) {
            "ok"
        } else {
            "FAILED"
        };
        out.push_str(&format!(
            "{} {}: {verdict}: {}\n",
            text(&answer["id"]),
            text(&k["kind"]),
            text(&k["detail"])
        ));
    }
    if answer["ok"] == Value::Bool(true) {
        Ok(out)
    } else {
        Err(CliError::CheckFailed(out.trim_end().to_string()))
    }
}

fn read(flag: &str, path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::Invalid(format!("{flag} {}: {e}", path.display())))
}

/// The PUT body: `--body`'s JSON, with each kind given by flags set over it.
fn put_body(p: &PutArgs) -> Result<Value, CliError> {
    let mut body = match &p.body {
        Some(path) => {
            serde_json::from_str::<Map<String, Value>>(&read("--body", path)?).map_err(|e| {
                CliError::Invalid(format!("--body {}: not a JSON object: {e}", path.display()))
            })?
        }
        None => Map::new(),
    };
    let opt = |v: &Option<String>| v.clone().map_or(Value::Null, Value::String);
    if let Some(path) = &p.apns_key {
        body.insert(
            "apns".into(),
            json!({
                "key": read("--apns-key", path)?,
                "key_id": opt(&p.apns_key_id),
                "team_id": opt(&p.apns_team_id),
                "topic": opt(&p.apns_topic),
                "environment": p.apns_environment,
                "endpoint": opt(&p.apns_endpoint),
            }),
        );
    }
    if let Some(path) = &p.fcm_service_account {
        let text = read("--fcm-service-account", path)?;
        let mut fcm = json!({ "service_account": text });
        if let Some(e) = &p.fcm_endpoint {
            fcm["endpoint"] = Value::String(e.clone());
        }
        body.insert("fcm".into(), fcm);
    }
    if let Some(path) = &p.vapid_key {
        body.insert(
            "webpush".into(),
            json!({ "vapid_key": read("--vapid-key", path)?, "subject": opt(&p.vapid_subject) }),
        );
    }
    if body.is_empty() {
        return Err(CliError::Invalid(
            "give --body FILE or at least one of --apns-key, --fcm-service-account, --vapid-key"
                .into(),
        ));
    }
    Ok(Value::Object(body))
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// `apns:active ABC123DEFG:sha256:… fcm:halted …`.
fn kinds(app: &Value) -> Vec<(String, String, String)> {
    let Some(creds) = app["credentials"].as_object() else {
        return Vec::new();
    };
    creds
        .iter()
        .map(|(k, c)| (k.clone(), text(&c["status"]), text(&c["fingerprint"])))
        .collect()
}

fn apps_table(apps: &[Value]) -> String {
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            let ks = kinds(a)
                .into_iter()
                .map(|(k, s, f)| format!("{k}:{s} {f}"))
                .collect::<Vec<_>>()
                .join(", ");
            vec![text(&a["id"]), text(&a["status"]), ks]
        })
        .collect();
    table(
        &["ID", "STATUS", "CREDENTIALS"],
        &[false, false, false],
        &rows,
    )
}

fn app_details(app: &Value) -> String {
    let mut out = format!("app {}: {}\n", text(&app["id"]), text(&app["status"]));
    if let Some(creds) = app["credentials"].as_object() {
        for (kind, c) in creds {
            out.push_str(&format!(
                "  {kind}: {} fingerprint {} (master key {})\n",
                text(&c["status"]),
                text(&c["fingerprint"]),
                text(&c["master_key_id"])
            ));
            if let Some(reason) = c["halted_reason"].as_str() {
                out.push_str(&format!("    halted: {reason}\n"));
            }
            out.push_str(&format!("    settings: {}\n", c["settings"]));
        }
    }
    out
}

async fn rotate(settings: &Settings, json: bool) -> Result<String, CliError> {
    let keyring = settings
        .apps
        .keyring
        .as_deref()
        .ok_or_else(|| CliError::Invalid(crate::apps::AppsError::NoMasterKey.to_string()))?;
    let options = settings.database.connect_options()?;
    let pool = crate::store::connect_with(options, 1, settings.database.connect_timeout()).await?;
    let report = crate::apps::store::rotate_master_key(&pool, keyring, Some("cli"))
        .await
        .map_err(|e| CliError::Invalid(format!("rotating the master key: {e}")));
    pool.close().await;
    let report = report?;
    if json {
        let mut s = serde_json::to_string_pretty(&report).expect("plain JSON");
        s.push('\n');
        return Ok(s);
    }
    let mut out = format!(
        "re-sealed {} row(s) under master key {} ({} rewritten meanwhile by a PUT)\n",
        report.resealed, report.current_key_id, report.skipped
    );
    for (app, kind, reason) in &report.failed {
        out.push_str(&format!("not re-sealed: app {app} {kind}: {reason}\n"));
    }
    if !report.failed.is_empty() {
        return Err(CliError::Invalid(format!(
            "{out}{} row(s) did not open: add the key that sealed them to \
             apps.old_master_key_files and run again",
            report.failed.len()
        )));
    }
    Ok(out)
}
