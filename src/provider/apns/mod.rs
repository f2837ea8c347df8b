//! APNs (Apple Push Notification service) over its HTTP/2 provider API, with token
//! (JWT) authentication.

pub mod answer;
pub mod jwt;
