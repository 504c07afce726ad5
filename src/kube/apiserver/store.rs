//! The object store: every object keyed by (kind, namespace, name), one global monotonically
//! increasing resourceVersion counter, and a bounded history of watch events (one event per
//! resourceVersion, so the history is contiguous). A commit persists before it becomes visible.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::Value;
use tokio::sync::watch;

use super::{meta, persist::Persister, status::ApiError};

/// Events kept for watches that resume from an older resourceVersion.
pub const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// Identifies one stored object. Cluster-scoped objects have an empty namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The `kind` (unique in the registry).
    pub kind: &'static str,
    /// The namespace, empty for cluster-scoped kinds.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object changed.
    Modified,
    /// The object was removed.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, as watches see it.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion the change was committed at.
    pub resource_version: u64,
    /// The object's kind.
    pub kind: &'static str,
    /// What happened.
    pub event_type: EventType,
    /// The object after the change (for DELETED: its last state, with the deletion's rv).
    pub object: Value,
    /// The object before the change, so selector watches can see objects leave.
    pub previous: Option<Value>,
}

/// A change to commit.
#[derive(Debug)]
pub enum Change {
    /// Store a new object.
    Create(Value),
    /// Replace an existing object.
    Update(Value),
    /// Remove an object; the value is its final state.
    Remove(Value),
}

/// All objects, the counter and the event history.
pub struct Store {
    objects: BTreeMap<ObjectKey, Value>,
    resource_version: u64,
    history: VecDeque<Arc<Event>>,
    /// Watches may resume from any resourceVersion at or after this one.
    floor: u64,
    history_limit: usize,
    persister: Option<Persister>,
    changes: watch::Sender<u64>,
}

impl Store {
    /// A store holding `objects` with the counter at `resource_version`.
    pub fn new(
        resource_version: u64,
        objects: BTreeMap<ObjectKey, Value>,
        persister: Option<Persister>,
    ) -> Self {
        Self {
            objects,
            resource_version,
            history: VecDeque::new(),
            floor: resource_version,
            history_limit: DEFAULT_HISTORY_LIMIT,
            persister,
            changes: watch::Sender::new(resource_version),
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// The oldest resourceVersion a watch may resume from.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// One object.
    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// The objects of `kind`, in one namespace or all, in key order.
    pub fn objects<'a>(
        &'a self,
        kind: &'static str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        let start = ObjectKey {
            kind,
            namespace: namespace.unwrap_or("").to_string(),
            name: String::new(),
        };
        self.objects.range(start..).take_while(move |(k, _)| {
            k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns)
        })
    }

    /// The events after `resource_version`, or `None` if the history no longer reaches back.
    pub fn events_after(&self, resource_version: u64) -> Option<impl Iterator<Item = &Arc<Event>>> {
        let skip = resource_version.checked_sub(self.floor)?;
        Some(
            self.history
                .iter()
                .skip(usize::try_from(skip).unwrap_or(usize::MAX)),
        )
    }

    /// A receiver that changes whenever a commit happens.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Forgets the whole event history: every watch resuming from before now gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.resource_version;
        self.changes.send_replace(self.resource_version);
    }

    /// Keeps at most `limit` events for resuming watches.
    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim_history();
        self.changes.send_replace(self.resource_version);
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(event) = self.history.pop_front() {
                self.floor = event.resource_version;
            }
        }
    }

    /// Commits a change at the next resourceVersion: persists it (if persisted: one database
    /// transaction), then makes it visible and records the event. Returns the object as stored (or as finally deleted).
    pub fn commit(&mut self, key: ObjectKey, change: Change) -> Result<Value, ApiError> {
        let resource_version = self.resource_version + 1;
        let (mut object, event_type) = match change {
            Change::Create(o) => (o, EventType::Added),
            Change::Update(o) => (o, EventType::Modified),
            Change::Remove(o) => (o, EventType::Deleted),
        };
        meta::meta_mut(&mut object).insert(
            "resourceVersion".to_string(),
            Value::String(resource_version.to_string()),
        );
        if let Some(persister) = &mut self.persister {
            let stored = (event_type != EventType::Deleted).then_some(&object);
            if let Err(e) = persister.write(resource_version, &key, stored) {
                let path = persister.path().display();
                return Err(ApiError::internal(format!("cannot write {path}: {e}")));
            }
        }
        let previous = if event_type == EventType::Deleted {
            self.objects.remove(&key)
        } else {
            self.objects.insert(key.clone(), object.clone())
        };
        self.resource_version = resource_version;
        self.history.push_back(Arc::new(Event {
            resource_version,
            kind: key.kind,
            event_type,
            object: object.clone(),
            previous,
        }));
        self.trim_history();
        self.changes.send_replace(resource_version);
        Ok(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            kind: "ConfigMap",
            namespace: "ns".to_string(),
            name: name.to_string(),
        }
    }

    fn cm(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns"}})
    }

    #[test]
    fn commits_assign_increasing_resource_versions_and_record_events() {
        let mut store = Store::new(0, BTreeMap::new(), None);
        let a = store
            .commit(key("a"), Change::Create(cm("a")))
            .expect("commit");
        assert_eq!(meta::get_str(&a, "resourceVersion"), Some("1"));
        store
            .commit(key("a"), Change::Update(cm("a")))
            .expect("commit");
        store
            .commit(key("a"), Change::Remove(cm("a")))
            .expect("commit");
        assert_eq!(store.resource_version(), 3);
        assert!(store.get(&key("a")).is_none());
        let types: Vec<_> = store
            .events_after(1)
            .expect("in history")
            .map(|e| (e.resource_version, e.event_type))
            .collect();
        assert_eq!(
            types,
            vec![(2, EventType::Modified), (3, EventType::Deleted)]
        );
    }

    #[test]
    fn the_bounded_history_raises_the_floor() {
        let mut store = Store::new(0, BTreeMap::new(), None);
        store.set_history_limit(2);
        for name in ["a", "b", "c", "d"] {
            store
                .commit(key(name), Change::Create(cm(name)))
                .expect("commit");
        }
        assert_eq!(store.floor(), 2);
        assert!(store.events_after(1).is_none());
        assert_eq!(store.events_after(2).expect("kept").count(), 2);
        store.compact();
        assert!(store.events_after(3).is_none());
        assert_eq!(store.events_after(4).expect("now").count(), 0);
    }

    #[test]
    fn objects_are_listed_by_kind_and_namespace() {
        let mut store = Store::new(0, BTreeMap::new(), None);
        for (ns, name) in [("a", "x"), ("b", "y"), ("b", "z")] {
            let key = ObjectKey {
                kind: "ConfigMap",
                namespace: ns.to_string(),
                name: name.to_string(),
            };
            store
                .commit(key, Change::Create(json!({})))
                .expect("commit");
        }
        let other = ObjectKey {
            kind: "Pod",
            namespace: "b".to_string(),
            name: "p".to_string(),
        };
        store
            .commit(other, Change::Create(json!({})))
            .expect("commit");
        let names = |ns| {
            store
                .objects("ConfigMap", ns)
                .map(|(k, _)| k.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(Some("b")), vec!["y", "z"]);
        assert_eq!(names(None), vec!["x", "y", "z"]);
        assert_eq!(names(Some("c")), Vec::<String>::new());
    }
}
