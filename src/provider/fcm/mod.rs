//! FCM HTTP v1 (being written: issue 20).

pub mod account;
pub mod answer;
pub mod body;
pub mod oauth;
