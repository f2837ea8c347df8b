//! [`Rate`]: a send rate that cannot hold an invalid value, validated once at construction.

use super::clock::{Nanos, NANOS_PER_SEC};

/// The highest rate pushpace accepts: 10 million sends per second.
pub const MAX_RATE_PER_SECOND: f64 = 10_000_000.0;
/// The lowest rate pushpace accepts: one send every 1,000 s. A campaign much slower than
/// this would hold its jobs, and its partition's committed offset, for days.
pub const MIN_RATE_PER_SECOND: f64 = 0.001;

/// Why a rate was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    #[error("send_rate must be a finite number, got {0}")]
    NotFinite(f64),
    #[error("send_rate must be greater than 0, got {0}")]
    NotPositive(f64),
    #[error(
        "send_rate must be at least {min} per second (one send every 1000 s), got {0}",
        min = MIN_RATE_PER_SECOND
    )]
    TooLow(f64),
    #[error("send_rate must be at most {max} per second, got {0}", max = MAX_RATE_PER_SECOND)]
    TooHigh(f64),
}

/// Sends per second: finite, ≥ [`MIN_RATE_PER_SECOND`] and ≤ [`MAX_RATE_PER_SECOND`].
/// Fractional rates (0.5/s) are fine.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    /// Validates `per_second` once; every later use can trust the value.
    pub fn per_second(per_second: f64) -> Result<Self, RateError> {
        if !per_second.is_finite() {
            return Err(RateError::NotFinite(per_second));
        }
        if per_second <= 0.0 {
            return Err(RateError::NotPositive(per_second));
        }
        if per_second < MIN_RATE_PER_SECOND {
            return Err(RateError::TooLow(per_second));
        }
        if per_second > MAX_RATE_PER_SECOND {
            return Err(RateError::TooHigh(per_second));
        }
        Ok(Self { per_second })
    }

    /// Sends per second.
    pub fn as_f64(self) -> f64 {
        self.per_second
    }

    /// The spacing between two sends, in nanoseconds, rounded to the nearest one.
    /// At the maximum rate this is 100 ns, so rounding changes the rate by at most 0.5%;
    /// algorithms that need better use [`Rate::interval_fp`].
    pub fn interval_nanos(self) -> Nanos {
        ((NANOS_PER_SEC as f64) / self.per_second).round().max(1.0) as Nanos
    }

    /// The spacing in fixed point: nanoseconds × 2^[`FP_SHIFT`]. Keeps the rounding error
    /// below 0.002% even at 10 M/s, where one interval is only 100 ns.
    pub fn interval_fp(self) -> u64 {
        (((NANOS_PER_SEC as f64) * FP_ONE as f64) / self.per_second)
            .round()
            .max(1.0) as u64
    }

    /// The rate as raw bits, for limiters that keep it in an atomic.
    pub(crate) fn to_bits(self) -> u64 {
        self.per_second.to_bits()
    }

    /// The inverse of [`Rate::to_bits`]; only ever given bits of a validated rate.
    pub(crate) fn from_bits(bits: u64) -> Self {
        Self {
            per_second: f64::from_bits(bits),
        }
    }

    /// How many sends fit in `nanos` at this rate (fractional).
    pub fn permits_in(self, nanos: Nanos) -> f64 {
        self.per_second * nanos as f64 / NANOS_PER_SEC as f64
    }
}

/// Fixed-point shift for [`Rate::interval_fp`]: 8 fractional bits. 2^8 × 2^64 ns headroom
/// leaves 2^56 ns ≈ 2.3 years of clock range in a u64, which a worker never reaches.
pub const FP_SHIFT: u32 = 8;
/// 1.0 in the fixed point of [`Rate::interval_fp`].
pub const FP_ONE: u64 = 1 << FP_SHIFT;

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_invalid_rates_with_a_reason() {
        assert_eq!(Rate::per_second(0.0), Err(RateError::NotPositive(0.0)));
        assert_eq!(Rate::per_second(-1.0), Err(RateError::NotPositive(-1.0)));
        assert!(matches!(
            Rate::per_second(f64::NAN),
            Err(RateError::NotFinite(_))
        ));
        assert!(matches!(
            Rate::per_second(f64::INFINITY),
            Err(RateError::NotFinite(_))
        ));
        assert_eq!(Rate::per_second(1e12), Err(RateError::TooHigh(1e12)));
        assert_eq!(Rate::per_second(1e-300), Err(RateError::TooLow(1e-300)));
        assert_eq!(
            Rate::per_second(0.000_999),
            Err(RateError::TooLow(0.000_999))
        );
        assert!(Rate::per_second(0.5).is_ok());
        assert!(Rate::per_second(MIN_RATE_PER_SECOND).is_ok());
        assert!(Rate::per_second(MAX_RATE_PER_SECOND).is_ok());
        let msg = Rate::per_second(1e-300).unwrap_err().to_string();
        assert!(msg.contains("at least 0.001 per second"), "{msg}");
        let msg = Rate::per_second(0.0).unwrap_err().to_string();
        assert!(msg.contains("greater than 0"), "{msg}");
    }

    #[test]
    fn intervals() {
        let r = Rate::per_second(1000.0).unwrap();
        assert_eq!(r.interval_nanos(), 1_000_000);
        assert_eq!(r.interval_fp(), 1_000_000 * FP_ONE);
        assert_eq!(
            Rate::per_second(0.5).unwrap().interval_nanos(),
            2 * NANOS_PER_SEC
        );
    }
}
