//! Supervisor sessions through `pods/exec` ([`PodExecutor::supervisor`], docs/commands.md §4):
//! the real kube-rs exec client against the in-process API server, whose exec backend runs the
//! real helper as the relay to a real `execution-helper supervise` playing the Pod's main
//! process. The session enrolls a fresh supervisor with the Pod's derived secret, carries
//! commands and follows end to end, and refuses a supervisor enrolled with another secret (a
//! replaced Pod's, another Pod's). The shared supervisor cases (`supervisor_support::cases`)
//! run here too, every call through the relay.

mod supervisor_support;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use execution_provider::executor::pod_exec::EXECUTOR_CONTAINER;
use execution_provider::executor::protocol::CommandState;
use execution_provider::executor::supervisor_protocol::{
    SupervisorReply, SupervisorRequest, derive_secret, secret_id,
};
use execution_provider::executor::{
    ExecutorTarget, ExecutorTransport, HelperExecBackend, PodExecutor, SupervisorSession,
    SupervisorTarget, TransportError,
};
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::runtime::{SeededIds, clock::OffsetClock};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use supervisor_support::*;

supervisor_cases!(crate::PodWorld::enrolled());

const NAMESPACE: &str = "execution";
const POD: &str = "executor-supervised";
const KEY: &[u8] = b"provider supervisor key, 32 byte";

/// An API server on loopback with one executor Pod whose main process is `supervised`.
struct PodWorld {
    supervised: Supervised,
    client: kube::Client,
    target: SupervisorTarget,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PodWorld {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl PodWorld {
    /// The Pod and its supervisor, not enrolled.
    async fn new() -> Self {
        let supervised = Supervised::start().await;
        let clock = OffsetClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let api = ApiServer::in_memory(Arc::new(clock), Arc::new(SeededIds::new(7)));
        let workspace = supervised.workspace.clone();
        let socket = supervised.socket.clone();
        api.set_exec_backend(Arc::new(
            HelperExecBackend::new(
                env!("CARGO_BIN_EXE_execution-helper"),
                Arc::new(move |request| (request.pod == POD).then(|| workspace.clone())),
            )
            .with_supervisor_sockets(Arc::new(move |request| {
                (request.pod == POD).then(|| socket.clone())
            })),
        ));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": EXECUTOR_CONTAINER, "image": "executor:dev"}]},
        }))
        .unwrap();
        let created = Api::<Pod>::namespaced(api.client(NAMESPACE), NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let api = api.clone();
                tokio::spawn(async move {
                    let _ = api.serve_connection(stream).await;
                });
            }
        });
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        Self {
            supervised,
            client,
            target: SupervisorTarget {
                executor: ExecutorTarget {
                    namespace: NAMESPACE.into(),
                    pod_name: POD.into(),
                    environment: "env-supervised".into(),
                },
                pod_uid: created.metadata.uid.unwrap(),
            },
            server,
        }
    }

    fn transport(&self) -> PodExecutor {
        PodExecutor::new(self.client.clone()).with_supervisor_key(KEY)
    }

    fn pod_secret(&self) -> [u8; 32] {
        derive_secret(KEY, NAMESPACE, POD, &self.target.pod_uid)
    }

    async fn session(&self) -> Result<SupervisorSession, TransportError> {
        self.transport().supervisor(&self.target).await
    }

    /// A world whose supervisor is enrolled through the relay and whose [`Supervised`] calls
    /// all go through it.
    async fn enrolled() -> Self {
        let mut world = Self::new().await;
        world.session().await.expect("the first session enrolls");
        world.supervised.source = Some(Box::new(Relayed {
            transport: world.transport(),
            target: world.target.clone(),
        }));
        world
    }
}

impl std::ops::Deref for PodWorld {
    type Target = Supervised;

    fn deref(&self) -> &Supervised {
        &self.supervised
    }
}

/// Sessions through `pods/exec` and the relay.
struct Relayed {
    transport: PodExecutor,
    target: SupervisorTarget,
}

impl SessionSource for Relayed {
    fn open(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = SupervisorSession> + Send + '_>> {
        Box::pin(async {
            self.transport
                .supervisor(&self.target)
                .await
                .expect("a session through the relay")
        })
    }
}

#[tokio::test]
async fn a_session_over_pods_exec_enrolls_a_fresh_supervisor_and_carries_commands_end_to_end() {
    let world = PodWorld::new().await;
    let mut session = world.session().await.expect("a session");
    let c = claim("a");
    let reply = session
        .call(&SupervisorRequest::Start(start_request(
            "op-relayed",
            &c,
            "echo one; read _ < /dev/null; echo two >&2",
        )))
        .await
        .unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");

    // Another session (another exec, another relay) finds the supervisor enrolled with this
    // Pod's secret and follows the command on the same channel.
    let mut second = world.session().await.expect("a second session");
    assert_eq!(second.hello().secret_id, secret_id(&world.pod_secret()));
    second
        .send(&SupervisorRequest::Follow {
            command_id: "op-relayed".into(),
            claim: c.clone(),
            offset: 0,
        })
        .await
        .unwrap();
    let mut output = Vec::new();
    let end = loop {
        match second.next_reply().await.unwrap() {
            Some(SupervisorReply::Output { chunks, .. }) => {
                output.extend(chunks.into_iter().flat_map(|c| c.data));
            }
            Some(SupervisorReply::Status(view)) => break view,
            other => panic!("unexpected follow frame {other:?}"),
        }
    };
    assert_eq!(output, b"one\ntwo\n");
    assert_eq!(end.state, CommandState::Succeeded);
    assert!(end.proven);

    // The supervisor itself holds the Pod's secret: a direct connection with it is heard.
    let direct = world.supervised.connect_with(world.pod_secret()).await;
    assert!(direct.enrolled_with_our_secret());
    // The first session still works after the others came and went.
    let reply = session
        .call(&SupervisorRequest::Journal {
            command_id: "op-relayed".into(),
            seal: false,
        })
        .await
        .unwrap();
    assert!(
        matches!(reply, SupervisorReply::Journal { entry: Some(_) }),
        "{reply:?}"
    );
}

#[tokio::test]
async fn a_supervisor_enrolled_with_another_pods_secret_is_refused() {
    let world = PodWorld::new().await;
    // A replaced Pod's secret (same name, another UID) was enrolled first.
    let replaced = derive_secret(KEY, NAMESPACE, POD, "uid-of-the-replaced-pod");
    let mut first = world.supervised.connect_with(replaced).await;
    assert!(matches!(
        first.enroll().await.unwrap(),
        SupervisorReply::Enrolled { .. }
    ));
    match world.session().await {
        Err(TransportError::StreamFailed { reason }) => {
            assert!(reason.contains("another secret"), "{reason}")
        }
        Ok(_) => panic!("a session with a supervisor of another secret"),
        Err(other) => panic!("unexpected {other:?}"),
    }
    // Under another key the same Pod's secret differs too.
    let other_key = PodExecutor::new(world.client.clone())
        .with_supervisor_key(b"another provider's supervisor key".to_vec());
    assert!(matches!(
        other_key.supervisor(&world.target).await,
        Err(TransportError::StreamFailed { .. })
    ));
}

#[tokio::test]
async fn without_a_key_a_target_or_a_supervisor_no_session_opens() {
    let world = PodWorld::new().await;
    let keyless = PodExecutor::new(world.client.clone());
    assert!(matches!(
        keyless.supervisor(&world.target).await,
        Err(TransportError::Unsupported)
    ));
    let no_uid = SupervisorTarget {
        pod_uid: String::new(),
        ..world.target.clone()
    };
    assert!(matches!(
        world.transport().supervisor(&no_uid).await,
        Err(TransportError::InvalidTarget { .. })
    ));
    let missing = SupervisorTarget {
        executor: ExecutorTarget {
            pod_name: "executor-gone".into(),
            ..world.target.executor.clone()
        },
        ..world.target.clone()
    };
    assert!(matches!(
        world.transport().supervisor(&missing).await,
        Err(TransportError::StreamFailed { .. })
    ));
    // The Pod's main process is gone: the relay finds no supervisor.
    let mut world = world;
    world.supervised.child.kill().await.unwrap();
    match world.session().await {
        Err(TransportError::StreamFailed { reason }) => {
            assert!(reason.contains("no supervisor answered"), "{reason}")
        }
        Ok(_) => panic!("a session without a supervisor"),
        Err(other) => panic!("unexpected {other:?}"),
    }
}
