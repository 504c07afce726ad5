//! Tests of the authority ledger: strict decoding, generation rollback and drift, and the
//! era-A key fingerprint rules (containment, reuse, version rollback, tombstones, the cap).

use std::sync::Arc;

use super::*;
use crate::kube::apiserver::ApiServer;
use crate::runtime::{SeededIds, SystemClock};

fn state(generation: u64, digest: &str) -> LedgerState {
    LedgerState {
        generation,
        digest: digest.to_owned(),
    }
}

fn print(digit: char) -> String {
    digit.to_string().repeat(64)
}

fn keys(entries: &[(&str, char)]) -> Fingerprints {
    entries
        .iter()
        .map(|(key, digit)| ((*key).to_owned(), print(*digit)))
        .collect()
}

fn record(generation: u64, digest: &str, entries: &[(&str, char)]) -> LedgerRecord {
    LedgerRecord {
        state: state(generation, digest),
        fingerprints: keys(entries),
    }
}

fn map(text: &str) -> ConfigMap {
    ConfigMap {
        data: Some(BTreeMap::from([(STATE_KEY.to_owned(), text.to_owned())])),
        ..ConfigMap::default()
    }
}

#[test]
fn only_a_strict_nonzero_state_parses_and_an_empty_key_is_generation_zero() {
    assert_eq!(parse(None).unwrap(), None);
    assert_eq!(parse(Some(&map(""))).unwrap(), None);
    let good = map(r#"{"generation":3,"digest":"ab"}"#);
    assert_eq!(parse(Some(&good)).unwrap(), Some(state(3, "ab")));
    for bad in [
        r#"{"generation":0,"digest":"ab"}"#,
        r#"{"generation":3,"digest":""}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k1":"PRINT"}}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k1:01":"PRINT"}}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k1:0":"PRINT"}}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k 1:1":"PRINT"}}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k1:1":"AB"}}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":[]}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":null}"#,
        r#"{"generation":3,"digest":"ab","fingerprints":{"k1:1":"PRINT","k1:1":"PRINT"}}"#,
        r#"{"generation":3,"digest":"ab","generation":3}"#,
        r#"{"generation":3,"digest":"ab"} {}"#,
        "not json",
    ] {
        let bad = bad.replace("PRINT", &print('a'));
        assert!(
            matches!(parse(Some(&map(&bad))), Err(LedgerError::Corrupt)),
            "{bad}"
        );
    }
    let era_a = format!(
        r#"{{"generation":3,"digest":"ab","fingerprints":{{"k1:1":"{}"}}}}"#,
        print('a')
    );
    let record = parse_record(Some(&map(&era_a))).unwrap().unwrap();
    assert_eq!(record.state, state(3, "ab"));
    assert_eq!(record.fingerprints, keys(&[("k1:1", 'a')]));
    let too_many: Fingerprints = (1..=65).map(|v| (format!("k:{v}"), print('a'))).collect();
    let text = serde_json::json!({"generation": 3, "digest": "ab", "fingerprints": too_many});
    assert!(matches!(
        parse(Some(&map(&text.to_string()))),
        Err(LedgerError::Corrupt)
    ));
}

#[tokio::test]
async fn the_ledger_advances_only_upwards_and_never_drifts() {
    let api = ApiServer::in_memory(Arc::new(SystemClock), Arc::new(SeededIds::new(3)));
    let ledger = AuthorityLedger::new(api.client("ns"), "ns", "authority");
    assert_eq!(ledger.read().await.unwrap(), None);
    ledger.advance(&state(1, "a")).await.unwrap();
    ledger.advance(&state(1, "a")).await.unwrap();
    assert!(matches!(
        ledger.advance(&state(1, "b")).await,
        Err(LedgerError::Drift(1))
    ));
    ledger.advance(&state(2, "b")).await.unwrap();
    assert!(matches!(
        ledger.advance(&state(1, "a")).await,
        Err(LedgerError::Rollback {
            candidate: 1,
            ledger: 2
        })
    ));
    assert_eq!(ledger.read().await.unwrap(), Some(state(2, "b")));
}

#[test]
fn at_the_same_generation_the_ledger_must_already_record_every_candidate_key() {
    let ledger = record(2, "d", &[("k1:1", 'a')]);
    assert_eq!(
        decide(Some(&ledger), &record(2, "d", &[("k1:1", 'a')])).unwrap(),
        None
    );
    assert!(matches!(
        decide(Some(&ledger), &record(2, "d", &[("k1:1", 'a'), ("k2:2", 'b')])),
        Err(LedgerError::KeyDrift { generation: 2, key }) if key == "k2:2"
    ));
    let unrecorded = record(2, "d", &[]);
    assert!(matches!(
        decide(Some(&unrecorded), &record(2, "d", &[("k1:1", 'a')])),
        Err(LedgerError::KeyDrift { .. })
    ));
}

#[test]
fn a_key_version_reused_with_another_fingerprint_is_rejected_at_any_generation() {
    let ledger = record(2, "d", &[("k1:1", 'a')]);
    for generation in [2, 3] {
        let reused = record(generation, "d", &[("k1:1", 'b')]);
        assert!(matches!(
            decide(Some(&ledger), &reused),
            Err(LedgerError::KeyReused(key)) if key == "k1:1"
        ));
    }
}

#[test]
fn a_new_key_version_must_be_above_every_recorded_version_of_that_id() {
    let ledger = record(2, "d", &[("k1:1", 'a'), ("k1:3", 'c'), ("k2:2", 'b')]);
    for (older, newest) in [("k1:2", 3), ("k2:1", 2)] {
        let err = decide(Some(&ledger), &record(3, "e", &[(older, 'f')])).unwrap_err();
        assert!(
            matches!(&err, LedgerError::VersionRollback { newest: n, .. } if *n == newest),
            "{older}: {err}"
        );
        assert!(err.to_string().contains("version rollback rejected"));
    }
    let written = decide(
        Some(&ledger),
        &record(3, "e", &[("k1:4", 'f'), ("k3:1", 'e')]),
    );
    assert_eq!(
        written.unwrap(),
        Some(keys(&[
            ("k1:1", 'a'),
            ("k1:3", 'c'),
            ("k1:4", 'f'),
            ("k2:2", 'b'),
            ("k3:1", 'e')
        ])),
        "the written set is the union: removed keys stay as tombstones"
    );
}

#[test]
fn more_than_sixty_four_recorded_fingerprints_ask_to_rotate_the_issuer() {
    let ledger = LedgerRecord {
        state: state(2, "d"),
        fingerprints: (1..=64).map(|v| (format!("k:{v}"), print('a'))).collect(),
    };
    let err = decide(Some(&ledger), &record(3, "e", &[("k:65", 'b')])).unwrap_err();
    assert!(matches!(err, LedgerError::TooManyKeys(65)), "{err}");
    assert!(err.to_string().contains("rotate issuer"));
    let still = decide(Some(&ledger), &record(3, "e", &[("k:64", 'a')])).unwrap();
    assert_eq!(still.map(|f| f.len()), Some(64));
}

#[tokio::test]
async fn published_keys_are_kept_as_tombstones_across_rotations() {
    let api = ApiServer::in_memory(Arc::new(SystemClock), Arc::new(SeededIds::new(4)));
    let ledger = AuthorityLedger::new(api.client("ns"), "ns", "authority");
    ledger
        .publish(&record(1, "a", &[("k1:1", 'a')]))
        .await
        .unwrap();
    ledger
        .publish(&record(2, "b", &[("k1:2", 'b')]))
        .await
        .unwrap();
    ledger.advance(&state(3, "c")).await.unwrap();
    let stored = ledger.read_record().await.unwrap().unwrap();
    assert_eq!(stored, record(3, "c", &[("k1:1", 'a'), ("k1:2", 'b')]));
    assert!(matches!(
        ledger
            .publish(&record(4, "d", &[("k1:1", 'a'), ("k1:2", 'c')]))
            .await,
        Err(LedgerError::KeyReused(_))
    ));
    assert_eq!(ledger.read_record().await.unwrap(), Some(stored));
}

#[test]
fn the_largest_ledger_the_rules_allow_parses_and_a_value_over_64_kib_is_corrupt() {
    // 64 fingerprints under 64-byte key ids: what an issuer at the cap has recorded.
    let full: Fingerprints = (1..=MAX_FINGERPRINTS)
        .map(|v| (format!("{}:{v}", "k".repeat(MAX_KEY_ID)), print('a')))
        .collect();
    let digest = "d".repeat(64);
    let text =
        serde_json::json!({"generation": u64::MAX >> 1, "digest": digest, "fingerprints": full})
            .to_string();
    let record = parse_record(Some(&map(&text))).unwrap().unwrap();
    assert_eq!(record.fingerprints.len(), MAX_FINGERPRINTS);
    // The value's bound is 64 KiB, trailing JSON whitespace included.
    let mut padded = text;
    padded.extend(std::iter::repeat_n(' ', (64 << 10) - padded.len()));
    assert!(parse_record(Some(&map(&padded))).unwrap().is_some());
    padded.push(' ');
    assert!(matches!(
        parse_record(Some(&map(&padded))),
        Err(LedgerError::Corrupt)
    ));
}
