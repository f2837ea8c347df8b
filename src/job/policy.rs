//! A campaign's delivery policy names: its priority class and its ramp-up. They live in
//! the lowest layer because the store, the scheduler, the API and the adapters all speak
//! them.

use super::Priority;

/// Under a shared cap a class is served strictly before the ones below it; within a
/// class the weighted max-min share holds.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PriorityClass {
    /// Transactional sends (password reset, order shipped): first, and may use
    /// `limiter.critical_overdraft` above a cap.
    Critical,
    High,
    #[default]
    Normal,
    /// Marketing broadcasts: what the classes above leave.
    Bulk,
}

impl PriorityClass {
    /// Every class, served in this order.
    pub const ALL: [PriorityClass; 4] = [
        PriorityClass::Critical,
        PriorityClass::High,
        PriorityClass::Normal,
        PriorityClass::Bulk,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PriorityClass::Critical => "critical",
            PriorityClass::High => "high",
            PriorityClass::Normal => "normal",
            PriorityClass::Bulk => "bulk",
        }
    }

    /// 0 for critical up to 3 for bulk: the order classes are served in.
    pub fn rank(self) -> usize {
        self as usize
    }

    /// The provider-level priority a job of this class gets when it sets none (APNs
    /// `apns-priority`, FCM `android.priority`, Web Push `Urgency`): `None` leaves the
    /// provider's own default, as for a campaign without a class.
    pub fn provider_priority(self) -> Option<Priority> {
        match self {
            PriorityClass::Critical | PriorityClass::High => Some(Priority::High),
            PriorityClass::Normal => None,
            // APNs 5, FCM NORMAL, Urgency normal: delivered when the device suits.
            PriorityClass::Bulk => Some(Priority::Normal),
        }
    }
}

impl std::fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority {0:?}; expected one of critical, high, normal, bulk")]
pub struct UnknownPriority(pub String);

impl std::str::FromStr for PriorityClass {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PriorityClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownPriority(s.chars().take(32).collect()))
    }
}

/// Longest ramp-up, in seconds (a day): longer is a rate, not a ramp.
pub const MAX_RAMP_UP_S: f64 = 86_400.0;
/// Smallest `ramp_from`, as a fraction of the full rate: below it the first seconds
/// would send nothing at low rates.
pub const MIN_RAMP_FROM: f64 = 0.01;
/// The shipped `limiter.ramp_from`: a ramp starts at 10% of the full rate.
pub const DEFAULT_RAMP_FROM: f64 = 0.1;
/// The most one second's target may exceed the one before during a ramp (FCM's
/// scaling guide: no sudden change). A ramp too short for this is lengthened.
pub const RAMP_MAX_STEP: f64 = 1.1;

/// The provider-level priority a job takes from its campaign's class, stamped by the
/// scheduler when it takes the job (and again when the class changes): a job's own
/// `priority` wins over it ([`super::Job::push_priority`]). Atomic so that a held job,
/// shared with sends in flight, can be re-stamped without a copy.
#[derive(Debug, Default)]
pub struct ClassPriority(std::sync::atomic::AtomicU8);

impl ClassPriority {
    const NONE: u8 = 0;

    pub fn set(&self, p: Option<Priority>) {
        let v = match p {
            None => Self::NONE,
            Some(Priority::High) => 1,
            Some(Priority::Normal) => 2,
            Some(Priority::Low) => 3,
        };
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<Priority> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(Priority::High),
            2 => Some(Priority::Normal),
            3 => Some(Priority::Low),
            _ => None,
        }
    }
}

impl Clone for ClassPriority {
    fn clone(&self) -> Self {
        let c = ClassPriority::default();
        c.set(self.get());
        c
    }
}
