//! Request-shape checks shared by the handlers (bounds of api-security §4.3).

use crate::api::pb;
use crate::store::naming::owner_hash;
use crate::store::{EnvRef, MAX_RUN_TTL, MIN_RUN_TTL};

/// Longest identity (ids, owner fields, operation ids, revisions).
pub const MAX_IDENTITY_BYTES: usize = 1024;
/// Longest binding id.
pub const MAX_BINDING_BYTES: usize = 253;

/// Non-empty and at most 1024 bytes.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_IDENTITY_BYTES
}

/// Non-empty and at most 253 bytes.
pub fn valid_binding(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_BINDING_BYTES
}

/// The owner hash of a well-formed owner.
pub fn owner(owner: Option<&pb::Owner>) -> Option<String> {
    let o = owner?;
    (valid_id(&o.issuer) && valid_id(&o.subject)).then(|| owner_hash(&o.issuer, &o.subject))
}

/// A well-formed environment reference.
pub fn env_ref(env: Option<&pb::EnvironmentRef>) -> Option<EnvRef> {
    let e = env?;
    (valid_id(&e.id) && valid_id(&e.revision)).then(|| EnvRef {
        id: e.id.clone(),
        revision: e.revision.clone(),
    })
}

/// A run TTL within bounds.
pub fn run_ttl(ttl_millis: i64) -> Option<std::time::Duration> {
    let ttl = std::time::Duration::from_millis(u64::try_from(ttl_millis).ok()?);
    (MIN_RUN_TTL..=MAX_RUN_TTL).contains(&ttl).then_some(ttl)
}

/// Template selector shape: id a DNS label of at most 63, revision exactly 67 characters.
pub fn template_selector(selector: Option<&pb::TemplateSelector>) -> Option<(String, String)> {
    let s = selector?;
    let ok = crate::security::manifest::is_dns_label(&s.id) && s.revision.len() == 67;
    ok.then(|| (s.id.clone(), s.revision.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds_are_inclusive() {
        assert!(run_ttl(30_000).is_some());
        assert!(run_ttl(300_000).is_some());
        assert!(run_ttl(29_999).is_none());
        assert!(run_ttl(300_001).is_none());
        assert!(run_ttl(-1).is_none());
    }

    #[test]
    fn owners_need_both_fields_within_bounds() {
        let good = pb::Owner {
            issuer: "i".into(),
            subject: "s".into(),
        };
        assert!(owner(Some(&good)).is_some());
        let empty = pb::Owner {
            issuer: String::new(),
            subject: "s".into(),
        };
        assert!(owner(Some(&empty)).is_none());
        let long = pb::Owner {
            issuer: "i".repeat(1025),
            subject: "s".into(),
        };
        assert!(owner(Some(&long)).is_none());
        assert!(owner(None).is_none());
    }
}
