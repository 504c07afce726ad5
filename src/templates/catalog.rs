//! Catalog items, display tokens and the inventory revision.
//!
//! Both tokens use the same scheme as revision ids: `v1-` + lowercase hex SHA-256 of RFC 8785
//! canonical JSON.
//!
//! - The **display token** of a template hashes `{"description", "extensions", "id", "name"}`
//!   of its catalog entry. It does not depend on the revision (a new default revision with the
//!   same display keeps the token) but changes with any display edit, so clients can cache
//!   display data by it.
//! - The **inventory revision** hashes the JSON array of the visible items, in the order given,
//!   each an object with the members `capabilities`, `description`, `displayToken`,
//!   `extensions`, `id`, `name` and `revision`. An empty catalog hashes `[]`, so a client that
//!   sees nothing gets a revision different from any non-empty catalog.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::display::TemplateDisplay;
use super::jcs::to_canonical_json;
use super::revision::REVISION_PREFIX;

/// What every environment can do.
pub const CAPABILITIES: [&str; 2] = ["filesystem", "foreground-command"];

/// One catalog entry: a template id, its default revision and display data. It never grants
/// authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogItem {
    /// The template id.
    pub id: String,
    /// The default revision id.
    pub revision: String,
    /// Display name (the template id when the revision sets none).
    pub name: String,
    /// Display description.
    pub description: String,
    /// Display token: changes with display data, not with the revision.
    pub display_token: String,
    /// Flattened extensions (`namespace/key` → value).
    pub extensions: BTreeMap<String, String>,
    /// Always [`CAPABILITIES`].
    pub capabilities: Vec<String>,
}

fn tagged_hash(value: &Value) -> String {
    let text = to_canonical_json(value).expect("catalog values hold only strings");
    format!(
        "{REVISION_PREFIX}{}",
        hex::encode(Sha256::digest(text.as_bytes()))
    )
}

/// The display token of a template's catalog entry.
pub fn display_token(id: &str, name: &str, display: &TemplateDisplay) -> String {
    tagged_hash(&json!({
        "id": id,
        "name": name,
        "description": display.description,
        "extensions": display.extensions,
    }))
}

/// The inventory revision of the items a client can see.
pub fn inventory_revision(visible_items: &[CatalogItem]) -> String {
    let items = visible_items
        .iter()
        .map(|item| {
            json!({
                "id": item.id,
                "revision": item.revision,
                "name": item.name,
                "description": item.description,
                "displayToken": item.display_token,
                "extensions": item.extensions,
                "capabilities": item.capabilities,
            })
        })
        .collect();
    tagged_hash(&Value::Array(items))
}
