//! The log of every committed write the replicas sent to the API server: the fault layer
//! records each successful write's answer (the object as stored, with its resourceVersion)
//! before it may lose that answer, so the checker judges every version of every object the
//! provider wrote, not only what happened to be stored between two simulation steps.

use std::sync::{Arc, Mutex};

/// One committed write.
#[derive(Debug, Clone)]
pub struct Written {
    /// The HTTP method (POST, PUT, PATCH, DELETE).
    pub method: String,
    /// The request path.
    pub path: String,
    /// The object the API server answered with.
    pub object: serde_json::Value,
}

impl Written {
    /// The object's kind (`Status` for a delete answered without the object).
    pub fn kind(&self) -> &str {
        self.object
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
    }

    /// The object's resourceVersion as a number (0 when absent).
    pub fn resource_version(&self) -> u64 {
        self.object
            .pointer("/metadata/resourceVersion")
            .and_then(|v| v.as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// The shared, append-only log; the driver drains it after every step.
#[derive(Debug, Clone, Default)]
pub struct WriteLog {
    entries: Arc<Mutex<Vec<Written>>>,
}

impl WriteLog {
    /// Records a committed write.
    pub fn push(&self, written: Written) {
        self.entries.lock().expect("write log lock").push(written);
    }

    /// Everything written since the last drain, in commit (resourceVersion) order.
    pub fn drain(&self) -> Vec<Written> {
        let mut entries = std::mem::take(&mut *self.entries.lock().expect("write log lock"));
        entries.sort_by_key(Written::resource_version);
        entries
    }
}
