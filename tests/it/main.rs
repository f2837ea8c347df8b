//! pushpace's integration tests: one crate, one binary, against the real services.

mod api;
mod broker;
mod browser;
mod capping;
mod cli;
mod distributed;
mod helpers;
mod hygiene;
mod job;
mod limiter;
mod pipeline;
mod poison_headers;
mod reliability;
mod sender;
mod store;
