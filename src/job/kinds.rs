//! The domain's names for where a job goes and how a job or a device can end: the
//! lowest layer, so that the provider and store layers above share them.

/// What a provider is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    Apns,
    Fcm,
    WebPush,
    /// The generic JSON POST (the webhook sender).
    Webhook,
    /// Sends nothing (benchmarks).
    Null,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Apns => "apns",
            ProviderKind::Fcm => "fcm",
            ProviderKind::WebPush => "webpush",
            ProviderKind::Webhook => "webhook",
            ProviderKind::Null => "null",
        }
    }
}

/// Why a message or a device ended in `dead_letters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterKind {
    /// Not valid JSON (or not UTF-8), or over the size limit.
    MalformedJob,
    /// Valid JSON that breaks the job rules (a field is missing, of the wrong type or out of range).
    InvalidJob,
    /// A device that could not be delivered: a permanent provider failure or too many attempts.
    Undeliverable,
    /// A parked job whose offset the broker's retention deleted before it was re-read.
    ExpiredOffset,
    /// A job whose devices were not all sent by its own or its campaign's `expires_at`:
    /// one letter per job, with the count.
    Expired,
    /// A job whose app was deleted: one letter per job, the job kept whole to replay.
    UnknownApp,
}

impl DeadLetterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::MalformedJob => "malformed_job",
            DeadLetterKind::InvalidJob => "invalid_job",
            DeadLetterKind::Undeliverable => "undeliverable",
            DeadLetterKind::ExpiredOffset => "expired_offset",
            DeadLetterKind::Expired => "expired",
            DeadLetterKind::UnknownApp => "unknown_app",
        }
    }
}
