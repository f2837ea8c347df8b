//! What `GET /api/apps` and `GET /api/apps/{id}` add to the store's views: per kind, the
//! lane this worker holds for the app (`app/<id>/<kind>` in its snapshot, `null` while
//! it holds none), and the campaigns every worker lately published as sending through
//! the app.

use crate::apps::provider::provider_name;
use crate::apps::store::{AppView, KindStatus, KindView};
use crate::apps::AppKind;
use crate::worker::scheduler::ProviderLive;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};

/// The whole seconds `sends_last_10s` sums.
pub const SENDS_WINDOW_S: u64 = 10;

/// An app as its GETs show it: the store's view, a `live` per kind, its campaigns.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AppDetail {
    pub id: String,
    pub status: KindStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub credentials: BTreeMap<AppKind, KindDetail>,
    /// The campaigns sending through it, over every worker that published lately.
    pub campaigns: Vec<String>,
}

/// One kind: what the store holds, and this worker's lane for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KindDetail {
    #[serde(flatten)]
    pub view: KindView,
    pub live: Option<KindLive>,
}

/// An app kind's lane in this worker's snapshot.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KindLive {
    /// `clear`, `backing off` or `paused`.
    pub state: &'static str,
    /// When paused: the unix time (ms) sending resumes.
    pub paused_until_unix_ms: Option<u64>,
    /// The adaptive ceiling while one binds.
    pub ceiling: Option<f64>,
    pub max_rate: Option<f64>,
    /// Sends dispatched in the last [`SENDS_WINDOW_S`] whole seconds.
    pub sends_last_10s: u64,
    /// One point a second (the last 5 minutes), for the chart; only on `GET /api/apps/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<SendPoint>>,
}

/// One second of an app kind's lane.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SendPoint {
    pub unix_s: u64,
    pub achieved: f64,
    pub ceiling: Option<f64>,
}

/// This worker's app lanes by name (the static providers left out).
pub fn app_lanes(providers: &[ProviderLive]) -> HashMap<&str, &ProviderLive> {
    providers
        .iter()
        .filter(|p| p.name.starts_with("app/"))
        .map(|p| (&*p.name, p))
        .collect()
}

/// The lane's figures at `now_s` (unix seconds): the seconds before it count as whole.
pub fn kind_live(p: &ProviderLive, now_s: u64, with_history: bool) -> KindLive {
    let from = now_s.saturating_sub(SENDS_WINDOW_S);
    let sends = p
        .history
        .iter()
        .filter(|h| h.unix_s >= from && h.unix_s < now_s)
        .map(|h| h.achieved.max(0.0))
        .sum::<f64>();
    KindLive {
        state: p.state,
        paused_until_unix_ms: p.paused_until_unix_ms,
        ceiling: p.ceiling,
        max_rate: p.max_rate,
        sends_last_10s: sends.round() as u64,
        history: with_history.then(|| {
            p.history
                .iter()
                .map(|h| SendPoint {
                    unix_s: h.unix_s,
                    achieved: h.achieved,
                    ceiling: h.ceiling,
                })
                .collect()
        }),
    }
}

/// `app` with each kind's lane from `lanes` and its `campaigns`.
pub fn detail(
    app: AppView,
    lanes: &HashMap<&str, &ProviderLive>,
    campaigns: Vec<String>,
    now_s: u64,
    with_history: bool,
) -> AppDetail {
    let credentials = app
        .credentials
        .into_iter()
        .map(|(kind, view)| {
            let live = lanes
                .get(provider_name(&app.id, kind).as_str())
                .map(|p| kind_live(p, now_s, with_history));
            (kind, KindDetail { view, live })
        })
        .collect();
    AppDetail {
        id: app.id,
        status: app.status,
        created_at: app.created_at,
        updated_at: app.updated_at,
        credentials,
        campaigns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::scheduler::LanePoint;
    use std::sync::Arc;

    fn lane(name: &str, points: &[(u64, f64)]) -> ProviderLive {
        ProviderLive {
            name: Arc::from(name),
            kind: "apns",
            max_rate: Some(500.0),
            adaptive: true,
            state: "backing off",
            paused_until_unix_ms: None,
            ceiling: Some(120.0),
            p95_ms: None,
            latency_target_ms: None,
            congestion: Default::default(),
            history: points
                .iter()
                .map(|&(unix_s, achieved)| LanePoint {
                    unix_s,
                    ceiling: Some(120.0),
                    demand: 200.0,
                    achieved,
                    accepted: achieved,
                })
                .collect(),
            origins: Vec::new(),
        }
    }

    fn kind_view() -> KindView {
        KindView {
            fingerprint: "ABC123DEFG:sha256:00".into(),
            status: KindStatus::Active,
            halted_reason: None,
            master_key_id: "k1".into(),
            settings: serde_json::json!({}),
            updated_at: Utc::now(),
        }
    }

    #[test]
    fn sends_sum_the_ten_whole_seconds_before_now() {
        // Seconds 989..=1000 at 1..=12 sends; now is 1000: 990..=999 count (2..=11).
        let points: Vec<(u64, f64)> = (989..=1000).map(|s| (s, (s - 988) as f64)).collect();
        let live = kind_live(&lane("app/a/apns", &points), 1000, false);
        assert_eq!(live.sends_last_10s, (2..=11).sum::<u64>());
        assert_eq!(live.state, "backing off");
        assert_eq!((live.ceiling, live.max_rate), (Some(120.0), Some(500.0)));
        assert!(live.history.is_none());
        // A stale snapshot counts only what falls in the window.
        assert_eq!(
            kind_live(&lane("app/a/apns", &points), 1005, false).sends_last_10s,
            (7..=12).sum::<u64>()
        );
        let with = kind_live(&lane("app/a/apns", &points), 1000, true);
        let h = with.history.unwrap();
        assert_eq!(h.len(), 12);
        assert_eq!(
            h[11],
            SendPoint {
                unix_s: 1000,
                achieved: 12.0,
                ceiling: Some(120.0)
            }
        );
    }

    #[test]
    fn each_kind_takes_its_own_apps_lane_only() {
        let providers = vec![
            lane("apns", &[(999, 50.0)]),
            lane("app/shop/apns", &[(999, 7.0)]),
            lane("app/shop-2/fcm", &[(999, 9.0)]),
        ];
        let lanes = app_lanes(&providers);
        assert_eq!(lanes.len(), 2, "the static provider is left out");
        let now = Utc::now();
        let app = AppView {
            id: "shop".into(),
            status: KindStatus::Active,
            created_at: now,
            updated_at: now,
            credentials: [(AppKind::Apns, kind_view()), (AppKind::Fcm, kind_view())]
                .into_iter()
                .collect(),
        };
        let d = detail(app, &lanes, vec!["c1".into()], 1000, false);
        let apns = d.credentials[&AppKind::Apns].live.as_ref().unwrap();
        assert_eq!(apns.sends_last_10s, 7);
        assert!(
            d.credentials[&AppKind::Fcm].live.is_none(),
            "shop-2's is not shop's"
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            v["credentials"]["apns"]["fingerprint"],
            "ABC123DEFG:sha256:00"
        );
        assert_eq!(v["credentials"]["apns"]["live"]["sends_last_10s"], 7);
        assert!(v["credentials"]["apns"]["live"].get("history").is_none());
        assert!(v["credentials"]["fcm"]["live"].is_null());
        assert_eq!(v["campaigns"], serde_json::json!(["c1"]));
    }
}
