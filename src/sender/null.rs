//! The null sender: delivers at once, for benchmarks and dry runs.

use super::{no_such_device, SendFuture, SendOutcome, Sender};
use crate::job::Job;
use std::sync::Arc;

/// Delivers every send at once without doing anything; allocates nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSender;

impl Sender for NullSender {
    #[inline]
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        if device_index < job.devices.len() {
            SendFuture::ready(SendOutcome::Delivered)
        } else {
            SendFuture::ready(no_such_device(job, device_index))
        }
    }

    fn name(&self) -> &'static str {
        "null"
    }
}
