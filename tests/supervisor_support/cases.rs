//! The supervisor cases every route to a supervisor must pass (docs/commands.md §11): over its
//! socket (`tests/supervisor.rs`) and through the `pods/exec` relay
//! (`tests/supervisor_pod_exec.rs`). `supervisor_cases!(MAKE)` expands to a module of tests,
//! each starting from `MAKE.await`, a value that dereferences to an enrolled [`Supervised`].

/// The shared cases, each on its own supervisor made by `$make.await`.
#[macro_export]
macro_rules! supervisor_cases {
    ($make:expr) => {
    mod supervisor_cases {
        #![allow(unused_imports)]
        use std::time::Duration;

        use $crate::supervisor_support::*;
        use execution_provider::executor::protocol::{CommandState, ErrorCode};
        use execution_provider::executor::supervisor_protocol::{
            CommandSignal, MAX_RUNNING_COMMANDS, StartRequest, SupervisorReply, SupervisorRequest,
            command_receipt,
        };

        trait ClaimTupleExt {
            fn with_run(&self, run: &str) -> Self;
        }

        impl ClaimTupleExt for execution_provider::executor::supervisor_protocol::ClaimTuple {
            fn with_run(&self, run: &str) -> Self {
                Self {
                    run_id: run.into(),
                    ..self.clone()
                }
            }
        }

        #[tokio::test]
        async fn a_detached_command_streams_both_streams_in_one_offset_space_and_ends_with_a_receipt() {
            let s = $make.await;
            let c = claim("a");
            let started = s
                .start_command("op-1", &c, "for i in 1 2 3; do echo $i; echo e$i >&2; done")
                .await;
            // The start answers the command as it stands: this short one may have ended already.
            assert!(
                matches!(started.state, CommandState::Running | CommandState::Succeeded),
                "{started:?}"
            );
            let followed = s.follow("op-1", &c, 0).await;
            assert_eq!(followed.stdout, b"1\n2\n3\n");
            assert_eq!(followed.stderr, b"e1\ne2\ne3\n");
            let mut expected = 0;
            for (offset, len) in &followed.spans {
                assert_eq!(
                    *offset, expected,
                    "offsets are contiguous: {:?}",
                    followed.spans
                );
                expected += *len as u64;
            }
            let end = followed.end.unwrap();
            assert_eq!(end.state, CommandState::Succeeded);
            assert!(end.proven);
            assert_eq!(end.next_offset, 15);
            assert_eq!(
                end.terminal_receipt,
                command_receipt(
                    "op-1",
                    CommandState::Succeeded,
                    0,
                    b"1\n2\n3\n",
                    b"e1\ne2\ne3\n"
                )
            );
            // A status from an offset answers the rest, and the same end.
            let SupervisorReply::Status(later) = s.status("op-1", &c, 12).await else {
                panic!("status refused")
            };
            assert_eq!(later.start_offset, 12);
            assert_eq!(later.next_offset, 15);
            let rest: Vec<u8> = later.chunks.iter().flat_map(|c| c.data.clone()).collect();
            assert_eq!(rest.len(), 3);
            assert_eq!(later.terminal_receipt, end.terminal_receipt);
            // Past the end is invalid.
            let error = error_of(s.status("op-1", &c, 16).await);
            assert_eq!(error.code, ErrorCode::InvalidArgument);
        }

        #[tokio::test]
        async fn output_reaches_a_follower_while_the_command_still_runs_and_a_reattach_resumes_at_its_offset()
         {
            let s = $make.await;
            let c = claim("a");
            s.start_command(
                "op-live",
                &c,
                "echo first; read _ < /dev/null; exec sleep 1000",
            )
            .await;
            let mut connection = s.open_session().await;
            connection
                .send(&SupervisorRequest::Follow {
                    command_id: "op-live".into(),
                    claim: c.clone(),
                    offset: 0,
                })
                .await
                .unwrap();
            let Some(SupervisorReply::Output { chunks, .. }) = connection.next_reply().await.unwrap()
            else {
                panic!("expected output")
            };
            assert_eq!(chunks[0].data, b"first\n");
            // The follower went away; the command keeps running and a new follower resumes.
            drop(connection);
            let SupervisorReply::Status(view) = s.status("op-live", &c, 6).await else {
                panic!("status refused")
            };
            assert_eq!(view.state, CommandState::Running);
            assert_eq!((view.start_offset, view.next_offset), (6, 6));
            let end = s.cancel("op-live", &c, 100).await;
            assert_eq!(end.state, CommandState::Cancelled);
            assert!(end.proven);
            assert!(!end.terminal_receipt.is_empty());
        }

        #[tokio::test]
        async fn cancel_proves_the_end_of_a_command_that_double_forked_and_setsid_while_another_keeps_running()
         {
            let s = $make.await;
            let c = claim("a");
            // The escapee: a grandchild in its own session, whose parent has already exited.
            s.start_command(
                "op-escape",
                &c,
                "(setsid sh -c 'echo $$ > escapee.pid; exec sleep 1000' &); exec sleep 1000",
            )
            .await;
            s.start_command("op-other", &c, "echo $$ > other.pid; exec sleep 1000")
                .await;
            let escapee = s.pid_file("escapee.pid").await;
            let other = s.pid_file("other.pid").await;
            assert!(alive(escapee) && alive(other));
            let session = std::fs::read_to_string(format!("/proc/{escapee}/stat")).unwrap();
            let fields: Vec<&str> = session
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            assert_eq!(
                fields[3],
                escapee.to_string(),
                "the escapee leads its own session"
            );

            let end = s.cancel("op-escape", &c, 200).await;
            assert_eq!(end.state, CommandState::Cancelled);
            assert!(end.proven, "the end is proven");
            assert!(!end.terminal_receipt.is_empty());
            assert!(!alive(escapee), "the setsid grandchild is gone");
            assert!(alive(other), "the other command keeps running");
            let SupervisorReply::Status(view) = s.status("op-other", &c, 0).await else {
                panic!("status refused")
            };
            assert_eq!(view.state, CommandState::Running);
            s.cancel("op-other", &c, 100).await;
            assert!(!alive(other));
        }

        #[tokio::test]
        async fn a_command_that_kills_its_own_reaper_still_ends_proven_and_its_orphans_are_swept() {
            let s = $make.await;
            let c = claim("a");
            s.start_command(
                "op-rogue",
                &c,
                "sh -c 'echo $$ > orphan.pid; exec sleep 1000' & sleep 0.2; kill -9 $PPID; wait",
            )
            .await;
            let orphan = s.pid_file("orphan.pid").await;
            let entry = s.ended("op-rogue").await;
            assert!(entry.proven, "{entry:?}");
            assert_eq!(entry.state, CommandState::Cancelled);
            assert!(!alive(orphan), "the orphan was swept");
        }

        #[tokio::test]
        async fn stdin_reaches_the_command_and_closing_it_ends_the_command() {
            let s = $make.await;
            let c = claim("a");
            let mut request = start_request("op-cat", &c, "cat; echo done");
            request.stdin = true;
            let view = s.start_with(request).await;
            assert!(view.stdin_open);
            let reply = s
                .call(SupervisorRequest::Stdin {
                    command_id: "op-cat".into(),
                    claim: c.clone(),
                    data: b"hello\n".to_vec(),
                    close: true,
                })
                .await;
            assert_eq!(
                reply,
                SupervisorReply::Stdin {
                    accepted: 6,
                    open: false
                }
            );
            let followed = s.follow("op-cat", &c, 0).await;
            assert_eq!(followed.stdout, b"hello\ndone\n");
            assert_eq!(followed.end.unwrap().state, CommandState::Succeeded);
            // Stdin of an ended command is refused.
            let error = error_of(
                s.call(SupervisorRequest::Stdin {
                    command_id: "op-cat".into(),
                    claim: c.clone(),
                    data: b"x".to_vec(),
                    close: false,
                })
                .await,
            );
            assert_eq!(error.code, ErrorCode::Conflict);
            // A command started without stdin has none.
            s.start_command("op-nostdin", &c, "exec sleep 1000").await;
            let error = error_of(
                s.call(SupervisorRequest::Stdin {
                    command_id: "op-nostdin".into(),
                    claim: c.clone(),
                    data: b"x".to_vec(),
                    close: false,
                })
                .await,
            );
            assert_eq!(error.code, ErrorCode::Conflict);
            let error = error_of(
                s.call(SupervisorRequest::Stdin {
                    command_id: "op-nostdin".into(),
                    claim: c.clone(),
                    data: vec![0; 64 * 1024 + 1],
                    close: false,
                })
                .await,
            );
            assert_eq!(error.code, ErrorCode::InvalidArgument);
            s.cancel("op-nostdin", &c, 100).await;
        }

        #[tokio::test]
        async fn a_signal_reaches_the_commands_process_group() {
            let s = $make.await;
            let c = claim("a");
            s.start_command(
                "op-trap",
                &c,
                "trap 'echo got-int; exit 7' INT; echo $$ > trap.pid; while :; do sleep 0.05; done",
            )
            .await;
            s.pid_file("trap.pid").await;
            let reply = s
                .call(SupervisorRequest::Signal {
                    command_id: "op-trap".into(),
                    claim: c.clone(),
                    signal: CommandSignal::Int,
                })
                .await;
            assert_eq!(reply, SupervisorReply::Ok {});
            let followed = s.follow("op-trap", &c, 0).await;
            assert_eq!(followed.stdout, b"got-int\n");
            let end = followed.end.unwrap();
            assert_eq!((end.state, end.exit_code), (CommandState::Failed, 7));
            let error = error_of(
                s.call(SupervisorRequest::Signal {
                    command_id: "op-trap".into(),
                    claim: c.clone(),
                    signal: CommandSignal::Kill,
                })
                .await,
            );
            assert_eq!(error.code, ErrorCode::Conflict);
        }

        #[tokio::test]
        async fn another_claim_or_an_older_epoch_sees_exactly_what_an_absent_command_looks_like() {
            let s = $make.await;
            let c = claim("a");
            s.start_command("op-mine", &c, "exec sleep 1000").await;
            let mut older = c.clone();
            older.epoch = 0;
            let mut revoked = c.clone();
            revoked.grant_generation = 2;
            let other_run = ClaimTupleExt::with_run(&c, "run-other");
            for foreign in [claim("b"), older, revoked, other_run] {
                assert_absent(s.status("op-mine", &foreign, 0).await);
                assert_absent(
                    s.call(SupervisorRequest::Cancel {
                        command_id: "op-mine".into(),
                        claim: foreign.clone(),
                        grace_ms: 1,
                    })
                    .await,
                );
                assert_absent(
                    s.call(SupervisorRequest::Signal {
                        command_id: "op-mine".into(),
                        claim: foreign.clone(),
                        signal: CommandSignal::Kill,
                    })
                    .await,
                );
                let SupervisorReply::StatusList { commands } = s
                    .call(SupervisorRequest::List {
                        claim: foreign.clone(),
                        limit: 0,
                    })
                    .await
                else {
                    panic!("list refused")
                };
                assert!(commands.is_empty());
                // Starting the same id under another claim does not reach the command either.
                assert_absent(
                    s.call(SupervisorRequest::Start(start_request(
                        "op-mine", &foreign, "true",
                    )))
                    .await,
                );
            }
            assert_absent(s.status("op-unknown", &c, 0).await);
            let SupervisorReply::Status(view) = s.status("op-mine", &c, 0).await else {
                panic!("the owner sees it")
            };
            assert_eq!(view.state, CommandState::Running);
            s.cancel("op-mine", &c, 100).await;
        }

        #[tokio::test]
        async fn a_claims_commands_are_killed_when_its_deadline_passes_and_a_renewal_keeps_them() {
            let s = $make.await;
            let (short, renewed, later) = (claim("short"), claim("renewed"), claim("later"));
            let mut request = start_request("op-short", &short, "echo $$ > short.pid; exec sleep 1000");
            request.lease_ms = 1_000;
            s.start_with(request).await;
            let mut request = start_request("op-renewed", &renewed, "exec sleep 1000");
            request.lease_ms = 1_000;
            s.start_with(request).await;
            let reply = s
                .call(SupervisorRequest::Renew {
                    claim: renewed.clone(),
                    lease_ms: 120_000,
                })
                .await;
            assert_eq!(reply, SupervisorReply::Renewed { commands: 1 });
            let pid = s.pid_file("short.pid").await;
            let entry = s.ended("op-short").await;
            assert_eq!(entry.state, CommandState::Cancelled);
            assert!(entry.proven);
            assert!(!alive(pid));
            // Its output is gone with its claim: the status answers absent, the journal keeps the
            // outcome.
            assert_absent(s.status("op-short", &short, 0).await);
            // A command started after the short one, with the same short lease, ends after it: the
            // renewed one, whose first deadline was earlier still, must be running then.
            let mut request = start_request("op-later", &later, "exec sleep 1000");
            request.lease_ms = 1_000;
            s.start_with(request).await;
            s.ended("op-later").await;
            let SupervisorReply::Status(view) = s.status("op-renewed", &renewed, 0).await else {
                panic!("status refused")
            };
            assert_eq!(view.state, CommandState::Running);
            s.cancel("op-renewed", &renewed, 100).await;
        }

        #[tokio::test]
        async fn sixteen_commands_run_at_once_the_seventeenth_is_refused_and_ending_the_claim_ends_them_all()
         {
            let s = $make.await;
            let c = claim("a");
            for i in 0..MAX_RUNNING_COMMANDS {
                s.start_command(&format!("op-{i}"), &c, "exec sleep 1000")
                    .await;
            }
            let error = error_of(
                s.call(SupervisorRequest::Start(start_request("op-17", &c, "true")))
                    .await,
            );
            assert_eq!(error.code, ErrorCode::ResourceExhausted);
            let SupervisorReply::StatusList { commands } = s
                .call(SupervisorRequest::EndClaim {
                    claim_id: c.claim_id.clone(),
                    grace_ms: 100,
                })
                .await
            else {
                panic!("end_claim refused")
            };
            assert_eq!(commands.len(), MAX_RUNNING_COMMANDS);
            assert!(
                commands
                    .iter()
                    .all(|v| v.state == CommandState::Cancelled && v.proven)
            );
            let entry = s.journal("op-3", false).await.unwrap();
            assert!(entry.proven && !entry.terminal_receipt.is_empty());
        }

        #[tokio::test]
        async fn variables_and_the_working_directory_reach_the_command_and_stay_inside_the_workspace() {
            let s = $make.await;
            let c = claim("a");
            std::fs::create_dir(s.workspace.join("sub")).unwrap();
            let mut request = start_request("op-env", &c, "echo \"$GREETING\"; pwd");
            request.env = vec![("GREETING".into(), "hello there".into())];
            request.working_dir = "sub".into();
            s.start_with(request).await;
            let followed = s.follow("op-env", &c, 0).await;
            let root = s.workspace.canonicalize().unwrap();
            assert_eq!(
                String::from_utf8(followed.stdout).unwrap(),
                format!("hello there\n{}\n", root.join("sub").display())
            );
            for (dir, code) in [
                ("../", ErrorCode::PermissionDenied),
                ("/etc", ErrorCode::PermissionDenied),
                ("missing", ErrorCode::InvalidArgument),
            ] {
                let mut request = start_request(&format!("op-wd-{code}"), &c, "true");
                request.working_dir = dir.into();
                let error = error_of(s.call(SupervisorRequest::Start(request)).await);
                assert_eq!(error.code, code, "{dir}");
            }
            let mut request = start_request("op-badenv", &c, "true");
            request.env = vec![("A=B".into(), "x".into())];
            let error = error_of(s.call(SupervisorRequest::Start(request)).await);
            assert_eq!(error.code, ErrorCode::InvalidArgument);
        }

        #[tokio::test]
        async fn a_window_keeps_the_newest_bytes_and_reports_what_fell_out() {
            let s = $make.await;
            let c = claim("a");
            let mut request = start_request("op-big", &c, "head -c 300000 /dev/zero | tr '\\0' x; echo");
            request.window_bytes = 100_000;
            s.start_with(request).await;
            s.ended("op-big").await;
            let SupervisorReply::Status(view) = s.status("op-big", &c, 0).await else {
                panic!("status refused")
            };
            assert_eq!(view.next_offset, 300_001);
            assert_eq!(view.start_offset, 200_001);
            assert_eq!(view.dropped_bytes, 200_001);
            let kept: usize = view.chunks.iter().map(|c| c.data.len()).sum();
            assert_eq!(kept, 100_000);
            assert!(view.proven && !view.terminal_receipt.is_empty());
        }
    }
    };
}
