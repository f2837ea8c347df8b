//! pushpace's integration tests: one crate, one binary, against the real services.

mod api;
mod broker;
mod browser;
mod cli;
mod helpers;
mod job;
mod limiter;
mod pipeline;
mod sender;
mod store;
