//! Per-job delivery options that map to each provider's own headers
//! (docs/JOB_FORMAT.md, "Delivery options").

/// How urgently the provider should deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// APNs 10, FCM `HIGH`, Web Push `Urgency: high`.
    High,
    /// APNs 5, FCM `NORMAL`, Web Push `Urgency: normal`.
    Normal,
    /// APNs 1, FCM `NORMAL`, Web Push `Urgency: low`.
    Low,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// APNs `apns-push-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushType {
    Alert,
    Background,
    Voip,
    Location,
    Fileprovider,
    Mdm,
    Liveactivity,
    Pushtotalk,
}

impl PushType {
    pub const ALL: [PushType; 8] = [
        PushType::Alert,
        PushType::Background,
        PushType::Voip,
        PushType::Location,
        PushType::Fileprovider,
        PushType::Mdm,
        PushType::Liveactivity,
        PushType::Pushtotalk,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PushType::Alert => "alert",
            PushType::Background => "background",
            PushType::Voip => "voip",
            PushType::Location => "location",
            PushType::Fileprovider => "fileprovider",
            PushType::Mdm => "mdm",
            PushType::Liveactivity => "liveactivity",
            PushType::Pushtotalk => "pushtotalk",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// The optional fields of a job that become provider headers. All `None` by default:
/// then each provider's own default applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushOptions {
    pub priority: Option<Priority>,
    /// APNs `apns-collapse-id`, FCM `collapse_key`, Web Push `Topic`: at most 64 bytes.
    pub collapse_id: Option<String>,
    /// Unix seconds after which the provider should not deliver (APNs `apns-expiration`).
    pub expiration: Option<i64>,
    /// Seconds the provider may store it (FCM `android.ttl`, Web Push `TTL`).
    pub ttl_s: Option<u32>,
    /// APNs only.
    pub push_type: Option<PushType>,
}
