//! The capacity ledger (store §2.5, DECISIONS 16, docs/store.md "The capacity ledger")
//! through the real store against the in-process API server: reservation before create,
//! migration of the format before sharding (with the live environments), release only on a
//! definitive rejection or a lost template race, and a missing ledger that fails clearly and
//! is never created. Reclaiming slots of ambiguous creates: `store_capacity_reclaim.rs`.

mod store_support;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{
    LEDGER_CONFIGMAP_NAME, LEDGER_SHARDS, ledger_key, ledger_shard_name, ledger_slots_key,
};
use execution_provider::store::naming::allocation_name;
use store_support::*;

#[tokio::test]
async fn an_allocation_reserves_its_slot_before_the_environment_exists() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let a = store.ensure_template(&req).await.expect("ensure");
    assert_eq!(world.ledger("roomy").await, vec![a.env.id.clone()]);
    assert_eq!(world.names().await, vec![a.env.id]);
}

#[tokio::test]
async fn the_capacity_is_the_least_limit_over_every_revision_of_the_template() {
    let world = World::new().await;
    let store = world.store();
    store
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b1", "small", "op-1",
        ))
        .await
        .expect("first");
    let err = store
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b2", "small", "op-2",
        ))
        .await
        .expect_err("second exceeds the pooled limit of 1");
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    assert_eq!(world.names().await.len(), 1, "no environment was created");
    assert_eq!(world.ledger("small").await.len(), 1);
}

#[tokio::test]
async fn a_replayed_allocation_does_not_take_a_second_slot() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "pair", "op-1");
    let first = store.ensure_template(&req).await.expect("first");
    let again = world.store().ensure_template(&req).await.expect("replay");
    assert_eq!(first, again);
    assert_eq!(world.ledger("pair").await, vec![first.env.id]);
}

#[tokio::test]
async fn a_ledger_of_the_format_before_sharding_is_migrated_with_the_live_environments() {
    let world = World::new().await;
    let first = world
        .store()
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b1", "small", "op-1",
        ))
        .await
        .expect("first");
    // The ledger as the release before sharding wrote it, missing the live environment (an
    // operator edit): the migration counts the live environment too.
    let mut map = world
        .config_maps()
        .get(LEDGER_CONFIGMAP_NAME)
        .await
        .expect("ledger");
    map.data = Some([(ledger_key("small"), "[]".to_owned())].into());
    world
        .config_maps()
        .replace(LEDGER_CONFIGMAP_NAME, &Default::default(), &map)
        .await
        .expect("rewrite");
    let err = world
        .store()
        .ensure_template(&ensure_request(
            &world, CLIENT, "bob", "b2", "small", "op-2",
        ))
        .await
        .expect_err("limit 1 is already used");
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    assert_eq!(world.ledger("small").await, vec![first.env.id]);
    let data = world
        .config_maps()
        .get(LEDGER_CONFIGMAP_NAME)
        .await
        .expect("ledger")
        .data
        .unwrap_or_default();
    assert!(
        !data.contains_key(&ledger_key("small")),
        "the old entry is gone"
    );
    assert!(data.contains_key(&ledger_slots_key("small")));
}

#[tokio::test]
async fn a_sharded_template_migrates_every_listed_name_into_its_shards() {
    let world = World::new().await;
    let names: Vec<String> = (0..40).map(|i| format!("exec-legacy-{i:02}")).collect();
    let mut map = world
        .config_maps()
        .get(LEDGER_CONFIGMAP_NAME)
        .await
        .expect("ledger");
    map.data = Some([(ledger_key("vast"), serde_json::to_string(&names).unwrap())].into());
    world
        .config_maps()
        .replace(LEDGER_CONFIGMAP_NAME, &Default::default(), &map)
        .await
        .expect("legacy");
    let a = world
        .store()
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b1", "vast", "op-1",
        ))
        .await
        .expect("ensure");
    let mut expected = names.clone();
    expected.push(a.env.id);
    expected.sort();
    assert_eq!(world.ledger("vast").await, expected);
    let slots = world.ledger_slots("vast").await;
    assert!(
        names.iter().all(|n| slots[n] == 0),
        "migrated names are held"
    );
    let mut used = std::collections::BTreeSet::new();
    for index in 0..LEDGER_SHARDS {
        let map = world
            .config_maps()
            .get(&ledger_shard_name(index))
            .await
            .expect("shard");
        let data = map.data.unwrap_or_default();
        assert!(!data.contains_key(&ledger_key("vast")));
        if data.contains_key(&ledger_slots_key("vast")) {
            used.insert(index);
        }
    }
    assert!(used.len() > 8, "spread over the shards: {used:?}");
}

#[tokio::test]
async fn a_definitive_create_failure_releases_the_slot() {
    let world = World::new().await;
    world.fail_write(1, Fault::Status(403), "executionenvironments");
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let err = world
        .store()
        .ensure_template(&req)
        .await
        .expect_err("forbidden");
    assert_eq!(err.code(), ErrorCode::Internal);
    assert!(world.ledger("roomy").await.is_empty(), "slot released");
    assert!(world.names().await.is_empty());
}

#[tokio::test]
async fn an_ambiguous_create_failure_keeps_the_slot() {
    let world = World::new().await;
    world.fail_write(1, Fault::Transport, "executionenvironments");
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let err = world
        .store()
        .ensure_template(&req)
        .await
        .expect_err("transport");
    assert_eq!(err.code(), ErrorCode::Internal);
    let name = allocation_name(CLIENT, &req.caller.owner_hash, "b1");
    assert_eq!(world.ledger("roomy").await, vec![name], "slot kept");
    world.clear_faults();
    let a = world
        .store()
        .ensure_template(&req)
        .await
        .expect("retry converges");
    assert_eq!(world.ledger("roomy").await, vec![a.env.id]);
}

#[tokio::test]
async fn a_binding_won_by_another_template_releases_the_losing_reservation() {
    let world = World::new().await;
    let store = world.store();
    let loser = ensure_request(&world, CLIENT, "alice", "b1", "pair", "op-2");
    let name = allocation_name(CLIENT, &loser.caller.owner_hash, "b1");
    // The race: the loser finds no environment and reserves its slot; just before its create
    // lands, another replica ensures the same binding with another template and wins.
    let winner = ensure_request(&world, CLIENT, "alice", "b1", "other", "op-1");
    let peer = world.store();
    let ledger = world.config_maps();
    let reserved_first = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = reserved_first.clone();
    let expected = name.clone();
    world.before_write("/executionenvironments", move || async move {
        let map = ledger.get(LEDGER_CONFIGMAP_NAME).await.expect("ledger");
        let entry = map
            .data
            .and_then(|d| d.get(&ledger_slots_key("pair")).cloned())
            .unwrap_or_default();
        *seen.lock().expect("seen") = Some(entry.contains(&format!("\"{expected}\"")));
        peer.ensure_template(&winner).await.expect("winner");
    });
    let err = store
        .ensure_template(&loser)
        .await
        .expect_err("binding taken");
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    assert_eq!(
        *reserved_first.lock().expect("seen"),
        Some(true),
        "the loser had reserved its slot before its create lost"
    );
    assert!(
        world.ledger("pair").await.is_empty(),
        "the losing reservation is released"
    );
    assert_eq!(
        world.ledger("other").await,
        vec![name],
        "winner's slot intact"
    );
}

#[tokio::test]
async fn a_missing_ledger_refuses_allocation_and_is_never_created() {
    let world = World::without_ledger();
    let store = world.store();
    let err = store
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b1", "roomy", "op-1",
        ))
        .await
        .expect_err("no ledger");
    assert_eq!(err.code(), ErrorCode::NotReady);
    assert!(store.ledger().check_present().await.is_err());
    assert!(
        world
            .config_maps()
            .get_opt(LEDGER_CONFIGMAP_NAME)
            .await
            .expect("get")
            .is_none()
    );
    assert!(world.names().await.is_empty());
}

#[tokio::test]
async fn a_corrupt_ledger_entry_fails_closed() {
    let world = World::new().await;
    let mut map = world
        .config_maps()
        .get(LEDGER_CONFIGMAP_NAME)
        .await
        .expect("ledger");
    map.data = Some(
        [
            (ledger_key("roomy"), "{\"not\":\"an array\"}".to_owned()),
            (
                ledger_slots_key("pair"),
                r#"{"slots":[["a",0],["a",1]]}"#.to_owned(),
            ),
        ]
        .into(),
    );
    world
        .config_maps()
        .replace(LEDGER_CONFIGMAP_NAME, &Default::default(), &map)
        .await
        .expect("corrupt");
    let err = world
        .store()
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b1", "roomy", "op-1",
        ))
        .await
        .expect_err("corrupt");
    assert_eq!(err.code(), ErrorCode::NotReady);
    let err = world
        .store()
        .ensure_template(&ensure_request(
            &world, CLIENT, "alice", "b2", "pair", "op-2",
        ))
        .await
        .expect_err("corrupt shard entry");
    assert_eq!(err.code(), ErrorCode::NotReady);
    assert!(world.names().await.is_empty());
}

#[tokio::test]
async fn concurrent_reservations_enforce_the_hard_limit() {
    let world = World::new().await;
    let (s1, s2) = (world.store(), world.store());
    let r1 = ensure_request(&world, CLIENT, "alice", "b1", "small", "op-1");
    let r2 = ensure_request(&world, CLIENT, "bob", "b2", "small", "op-2");
    // Interleaved: the first reservation has read its ledger shard; just before its write
    // lands, the second allocation takes the last slot.
    world.before_write("/configmaps/", move || async move {
        s2.ensure_template(&r2)
            .await
            .expect("the second allocation");
    });
    let refused = s1
        .ensure_template(&r1)
        .await
        .expect_err("the slot was taken between the read and the write");
    assert_eq!(refused.code(), ErrorCode::ResourceExhausted);
    let names = world.names().await;
    assert_eq!(names.len(), 1, "exactly one admitted: {names:?}");
    assert_eq!(
        world.ledger("small").await,
        names,
        "ledger equals the live environments"
    );
}

#[tokio::test]
async fn ensure_is_stable_for_the_same_request_and_refuses_drift_of_template_or_operation() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let first = store.ensure_template(&req).await.expect("ensure");
    let again = store.ensure_template(&req).await.expect("same request");
    assert_eq!(again, first, "same environment, revision and epoch");
    let other_template = ensure_request(&world, CLIENT, "alice", "b1", "other", "op-1");
    let err = store
        .ensure_template(&other_template)
        .await
        .expect_err("drift");
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    let other_op = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-2");
    let err = store
        .ensure_template(&other_op)
        .await
        .expect_err("not a lookup");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_eq!(world.names().await, vec![first.env.id.clone()]);
    assert_eq!(
        world.ledger("other").await,
        Vec::<String>::new(),
        "loser's slot released"
    );
}

#[tokio::test]
async fn an_allocation_persists_the_owner_attestation_in_the_spec() {
    let world = World::new().await;
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let a = world.store().ensure_template(&req).await.expect("ensure");
    let spec = world.get(&a.env.id).await.spec;
    assert_eq!(spec.owner_issuer.as_deref(), Some(ISSUER));
    assert_eq!(spec.owner_subject.as_deref(), Some("alice"));
    assert_eq!(spec.owner_hash, req.caller.owner_hash);
}

#[tokio::test]
async fn a_deprecated_revision_serves_its_environments_and_a_revoked_one_refuses_them() {
    let world = World::new().await;
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-1");
    let a = world.store().ensure_template(&req).await.expect("ensure");
    let deprecated = world.store_with(registry_with_roomy("deprecated"));
    let retry = deprecated
        .ensure_template(&req)
        .await
        .expect("existing served");
    assert_eq!(retry.env, a.env);
    let mut new_binding = req.clone();
    new_binding.binding_id = "b2".to_owned();
    let err = deprecated
        .ensure_template(&new_binding)
        .await
        .expect_err("new");
    assert_eq!(err.code(), ErrorCode::NotFound);
    let revoked = world.store_with(registry_with_roomy("revoked"));
    let err = revoked.ensure_template(&req).await.expect_err("revoked");
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(
        world.names().await,
        vec![a.env.id],
        "nothing else allocated"
    );
}
