//! limiter tests.
