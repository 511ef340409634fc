//! A KRaft cluster of one or three combined broker+controller JVMs on loopback.

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use super::node::KafkaNode;
use super::probe::{coordinator_loaded, find_coordinator, group_on_partition, under_replicated};
use super::scratch::ScratchDir;

/// Bound on a cluster (or a restarted node) becoming ready. A node is usually ready in a few
/// seconds; two cores shared with compilers and other JVMs can make that much longer.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Attempts with fresh ports when another process takes a chosen port first.
const START_ATTEMPTS: usize = 3;
/// Bound on FindCoordinator naming a new coordinator after its broker was killed: the
/// controller fences a silent broker after broker.session.timeout.ms (3 s here), longer if it
/// was also the active controller and a new one must be elected first.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start: how many nodes, the group settings a test depends on, and any extra broker
/// properties.
#[derive(Clone)]
pub struct KafkaOptions {
    nodes: usize,
    initial_rebalance_delay: Duration,
    extra: Vec<(String, String)>,
    /// Listeners beyond PLAINTEXT and CONTROLLER: (listener name, security protocol).
    listeners: Vec<(String, String)>,
    /// `--add-scram` arguments for the format step.
    scram: Vec<String>,
    /// Told each node's client port once they are chosen, before any node starts.
    on_ports: Option<PortsHook>,
    /// `-Dkey=value` arguments for each node's JVM.
    jvm_args: Vec<String>,
}

type PortsHook = std::sync::Arc<dyn Fn(&[u16]) + Send + Sync>;

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("nodes", &self.nodes)
            .field("initial_rebalance_delay", &self.initial_rebalance_delay)
            .field("extra", &self.extra)
            .finish_non_exhaustive()
    }
}

impl KafkaOptions {
    /// One node, `group.initial.rebalance.delay.ms=0`.
    pub fn single_node() -> KafkaOptions {
        KafkaOptions {
            nodes: 1,
            initial_rebalance_delay: Duration::ZERO,
            extra: Vec::new(),
            listeners: Vec::new(),
            scram: Vec::new(),
            on_ports: None,
            jvm_args: Vec::new(),
        }
    }

    /// Three nodes, one controller quorum, internal topics replicated three times,
    /// `group.initial.rebalance.delay.ms=0`.
    pub fn three_nodes() -> KafkaOptions {
        KafkaOptions {
            nodes: 3,
            ..KafkaOptions::single_node()
        }
    }

    /// `group.initial.rebalance.delay.ms`: how long an empty group's first JoinGroup waits for
    /// more members (Kafka's default is 3000 ms).
    pub fn initial_rebalance_delay(mut self, delay: Duration) -> KafkaOptions {
        self.initial_rebalance_delay = delay;
        self
    }

    /// Any broker property; it wins over the defaults below (a later key wins in a Java
    /// properties file).
    pub fn property(mut self, key: &str, value: impl ToString) -> KafkaOptions {
        self.extra.push((key.to_owned(), value.to_string()));
        self
    }

    /// One more listener named `name` (also its `listener.name.<name lower-cased>.` config
    /// prefix) speaking `protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) on a port of its
    /// own, advertised like the PLAINTEXT one. Inter-broker and controller traffic stays on
    /// PLAINTEXT, so the readiness probes need no credentials.
    pub fn listener(mut self, name: &str, protocol: &str) -> KafkaOptions {
        self.listeners.push((name.to_owned(), protocol.to_owned()));
        self
    }

    /// A SCRAM credential created when the storage is formatted (`kafka-storage format
    /// --add-scram`), e.g. `SCRAM-SHA-512=[name=alice,password=secret]`: KRaft keeps SCRAM
    /// credentials in its metadata log, and this is the way to have them before the broker
    /// serves clients.
    pub fn scram(mut self, spec: &str) -> KafkaOptions {
        self.scram.push(spec.to_owned());
        self
    }

    /// A Java system property for each node's JVM (`-Dkey=value`), for settings Kafka reads
    /// only from system properties (such as the OAuth URLs a broker may reach).
    pub fn jvm_property(mut self, key: &str, value: impl ToString) -> KafkaOptions {
        self.jvm_args.push(format!("-D{key}={}", value.to_string()));
        self
    }

    pub(super) fn extra_listeners(&self) -> &[(String, String)] {
        &self.listeners
    }

    pub(super) fn scram_credentials(&self) -> &[String] {
        &self.scram
    }

    /// Calls `f` with every node's client port once they are chosen, before any node starts: a
    /// proxy that a node advertises (`advertised.listeners`) must forward before the start-up
    /// checks, which follow the advertised address, can pass.
    pub fn on_ports(mut self, f: impl Fn(&[u16]) + Send + Sync + 'static) -> KafkaOptions {
        self.on_ports = Some(std::sync::Arc::new(f));
        self
    }

    /// Every property beyond the node's identity and listeners, each with its reason.
    pub(super) fn properties(&self, nodes: usize) -> Vec<(String, String)> {
        let cluster = nodes > 1;
        let replicas = nodes.to_string();
        let mut props: Vec<(&str, String)> = vec![
            // Tests create every topic they use; a typo must fail, not create a topic.
            ("auto.create.topics.enable", "false".into()),
            (
                "group.initial.rebalance.delay.ms",
                self.initial_rebalance_delay.as_millis().to_string(),
            ),
            // One partition on a single node, so every group has the same coordinator; three in
            // a cluster, so the partitions' leaders, and with them groups' coordinators, differ.
            (
                "offsets.topic.num.partitions",
                if cluster { "3" } else { "1" }.into(),
            ),
            // The default (3) on a single node would keep __consumer_offsets from ever being
            // created, and FindCoordinator from ever succeeding.
            ("offsets.topic.replication.factor", replicas.clone()),
            ("transaction.state.log.replication.factor", replicas.clone()),
            (
                "transaction.state.log.min.isr",
                if cluster { "2" } else { "1" }.into(),
            ),
            // Topics a test creates (KafkaAdmin create-topic) survive the loss of a node.
            ("default.replication.factor", replicas),
            // The cleaner allocates this buffer at start-up: 128 MiB by default, a quarter of
            // the heap. It must stay above 1 MiB per cleaner thread.
            (
                "log.cleaner.dedupe.buffer.size",
                (2 * 1024 * 1024).to_string(),
            ),
            ("log.cleaner.threads", "1".into()),
            // Thread pools sized for a two-core machine running several brokers.
            ("num.network.threads", "2".into()),
            ("num.io.threads", "2".into()),
            ("group.coordinator.threads", "1".into()),
        ];
        if cluster {
            props.extend([
                // A killed broker is fenced, and its partitions (and groups) move, after 3 s of
                // silence instead of 9.
                ("broker.session.timeout.ms", "3000".into()),
                ("broker.heartbeat.interval.ms", "500".into()),
                // Otherwise the controller moves leadership, and with it group coordinators,
                // back to a restarted node by itself, in the middle of a failover test.
                ("auto.leader.rebalance.enable", "false".into()),
            ]);
        }
        props
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .chain(self.extra.iter().cloned())
            .collect()
    }
}

/// A running Apache Kafka cluster. Dropping it kills every node and removes its files.
pub struct KafkaCluster {
    // Declared before `dir`: fields drop in order, and the JVMs must be gone before their
    // directory is removed.
    nodes: Vec<KafkaNode>,
    options: KafkaOptions,
    cluster_id: String,
    dir: ScratchDir,
}

impl KafkaCluster {
    /// Formats and starts `options`' nodes together (a broker waits for the controller quorum,
    /// so they must start together), and returns once every node answers FindCoordinator for a
    /// group on every `__consumer_offsets` partition and every partition is fully in sync.
    ///
    /// # Panics
    /// When Java or the jars are missing, or the cluster is not ready within 180 s; the message
    /// carries the end of each node's log.
    pub fn start(options: KafkaOptions) -> KafkaCluster {
        let mut failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let mut cluster = KafkaCluster::prepare(options.clone());
            let all: Vec<i32> = cluster.nodes.iter().map(|n| n.id()).collect();
            let Err(e) = cluster.launch(&all) else {
                return cluster;
            };
            let port_race = cluster.nodes.iter().any(|n| n.lost_port_race());
            // Dropped before panicking: its log tails are in the message already.
            drop(cluster);
            failure = e;
            // Another process took a port between our probe and the broker's bind: try fresh
            // ones. Anything else is final.
            if !port_race {
                break;
            }
        }
        panic!("{failure}");
    }

    fn prepare(options: KafkaOptions) -> KafkaCluster {
        super::jvm(); // fails early, with the install hint
        let n = options.nodes;
        let dir = ScratchDir::new(if n == 1 { "single" } else { "cluster" });
        let per_node = 2 + options.listeners.len();
        let ports = free_ports(per_node * n);
        let nodes: Vec<KafkaNode> = (0..n)
            .map(|i| {
                let id = i as i32 + 1;
                let base = per_node * i;
                let extra = options
                    .listeners
                    .iter()
                    .enumerate()
                    .map(|(j, (name, protocol))| {
                        (name.clone(), protocol.clone(), ports[base + 2 + j])
                    })
                    .collect();
                KafkaNode::new(
                    id,
                    ports[base],
                    ports[base + 1],
                    dir.path().join(format!("node-{id}")),
                )
                .with_listeners(extra)
                .with_jvm_args(options.jvm_args.clone())
            })
            .collect();
        let voters = nodes
            .iter()
            .map(|node| format!("{}@127.0.0.1:{}", node.id(), node.controller_port()))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_id = new_cluster_id();
        for node in &nodes {
            node.write_config(&voters, n, &options);
        }
        if let Some(f) = &options.on_ports {
            f(&nodes.iter().map(|node| node.port()).collect::<Vec<_>>());
        }
        // One JVM each; in parallel, as the two cores allow.
        std::thread::scope(|s| {
            let formats: Vec<_> = nodes
                .iter()
                .map(|node| s.spawn(|| node.format(&cluster_id, options.scram_credentials())))
                .collect();
            for f in formats {
                if let Err(e) = f.join().expect("format thread") {
                    panic!("{e}");
                }
            }
        });
        KafkaCluster {
            nodes,
            options,
            cluster_id,
            dir,
        }
    }

    /// Starts the given nodes' JVMs and waits until each is ready.
    fn launch(&mut self, ids: &[i32]) -> Result<(), String> {
        for &id in ids {
            self.node_mut(id).launch()?;
        }
        self.wait_ready(ids)
    }

    /// Polls each node until it answers FindCoordinator with no error for a group on every
    /// `__consumer_offsets` partition, and the coordinator it names has loaded that partition:
    /// only then can any group be used through any node.
    fn wait_ready(&mut self, ids: &[i32]) -> Result<(), String> {
        let partitions = self.offsets_partitions();
        let probes: Vec<String> = (0..partitions)
            .map(|p| group_on_partition("kafka-lock-ready", p, partitions))
            .collect();
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut waiting: Vec<i32> = ids.to_vec();
        let mut last = String::from("no attempt yet");
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for id in waiting {
                let node = self.node_mut(id);
                if let Some(status) = node.exited() {
                    return Err(self.failure(&format!(
                        "node {id} exited with {status} before it was ready"
                    )));
                }
                let addr = node.addr();
                match probes.iter().try_for_each(|g| coordinator_loaded(&addr, g)) {
                    Ok(_) => node.mark_ready(),
                    Err(e) => {
                        last = e;
                        still.push(id);
                    }
                }
            }
            waiting = still;
            if waiting.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!(
                    "nodes {waiting:?} did not answer FindCoordinator within {READY_TIMEOUT:?} \
                     (last attempt: {last})"
                )));
            }
            // Polling: a broker offers no readiness signal a client can wait on.
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.nodes.len() > 1 && self.nodes.iter().all(|n| n.is_live()) {
            self.await_full_isr(deadline)?;
        }
        Ok(())
    }

    /// Waits until every partition of every topic has a leader and all its replicas in sync, as
    /// every live node sees it.
    ///
    /// A cluster is not back to full strength when its nodes answer: `__consumer_offsets` is
    /// created by the first FindCoordinator, possibly while a node is still fenced, and a node
    /// that was down rejoins the in-sync replicas only after it caught up. Until then, losing the
    /// one in-sync replica of a partition leaves it without a leader (Kafka never elects an
    /// out-of-sync one), and every group on it without a coordinator, for as long as that node
    /// is down. [`KafkaCluster::start`] and [`KafkaCluster::restart`] wait for this; call it
    /// after [`KafkaCluster::resume`] before the next disruption.
    ///
    /// # Panics
    /// When that does not happen within 180 s (e.g. a node is down).
    pub fn wait_for_full_isr(&self) {
        if let Err(e) = self.await_full_isr(Instant::now() + READY_TIMEOUT) {
            panic!("{e}");
        }
    }

    fn await_full_isr(&self, deadline: Instant) -> Result<(), String> {
        loop {
            let mut problems = Vec::new();
            for node in self.nodes.iter().filter(|n| n.is_live()) {
                match under_replicated(&node.addr()) {
                    Ok(p) => {
                        problems.extend(p.into_iter().map(|p| format!("node {}: {p}", node.id())))
                    }
                    Err(e) => problems.push(e),
                }
            }
            if problems.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!(
                    "partitions not fully in sync by the deadline: {problems:?}"
                )));
            }
            // Polling: in-sync replica changes reach clients only through Metadata.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn failure(&self, what: &str) -> String {
        let logs: Vec<String> = self.nodes.iter().map(|n| n.log_tail(40)).collect();
        format!(
            "{what}\n{}\nWhole logs kept in {}. If Java or the Kafka jars are missing or broken, {}.",
            logs.join("\n"),
            self.keep_logs().display(),
            super::INSTALL_HINT
        )
    }

    /// Copies every node's log out of the cluster's directory, which goes with the cluster, into
    /// `target/tmp/kafka-failed-logs/<unique>/node-<id>.log`, and returns that folder.
    fn keep_logs(&self) -> std::path::PathBuf {
        let keep = super::new_log_path("kafka-failed").with_extension("");
        for node in &self.nodes {
            let copy = keep.join(format!("node-{}.log", node.id()));
            let _ =
                std::fs::create_dir_all(&keep).and_then(|()| std::fs::copy(node.log_path(), &copy));
        }
        keep
    }

    /// The `__consumer_offsets` partition count the brokers were started with.
    pub fn offsets_partitions(&self) -> i32 {
        self.options
            .properties(self.nodes.len())
            .iter()
            .rev()
            .find(|(k, _)| k == "offsets.topic.num.partitions")
            .and_then(|(_, v)| v.parse().ok())
            .expect("offsets.topic.num.partitions is always set")
    }

    /// Every node's client address, comma-separated, for a client's bootstrap list.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The first node's port (the only one on a single node).
    pub fn port(&self) -> u16 {
        self.nodes[0].port()
    }

    /// The nodes, in `node.id` order (1, 2, 3).
    pub fn nodes(&self) -> &[KafkaNode] {
        &self.nodes
    }

    /// The node with `node.id` `id`.
    ///
    /// # Panics
    /// When there is no such node.
    pub fn node(&self, id: i32) -> &KafkaNode {
        self.nodes
            .iter()
            .find(|n| n.id() == id)
            .unwrap_or_else(|| panic!("no node {id} in a cluster of {}", self.nodes.len()))
    }

    fn node_mut(&mut self, id: i32) -> &mut KafkaNode {
        let n = self.nodes.len();
        self.nodes
            .iter_mut()
            .find(|node| node.id() == id)
            .unwrap_or_else(|| panic!("no node {id} in a cluster of {n}"))
    }

    /// The directory holding every node's configuration, data and log; removed with the cluster.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The cluster id the nodes were formatted with.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// SIGKILLs node `id`: no controlled shutdown, no goodbye to the controller.
    pub fn kill(&mut self, id: i32) {
        self.node_mut(id).kill();
    }

    /// SIGSTOPs node `id`: its sockets stay open and nothing answers.
    pub fn pause(&mut self, id: i32) {
        self.node_mut(id).signal(libc::SIGSTOP);
    }

    /// SIGCONTs node `id` after [`KafkaCluster::pause`].
    pub fn resume(&mut self, id: i32) {
        self.node_mut(id).signal(libc::SIGCONT);
    }

    /// SIGTERMs node `id` (a controlled shutdown) without waiting; [`KafkaCluster::terminate`]
    /// waits for the exit.
    pub fn begin_terminate(&mut self, id: i32) {
        self.node_mut(id).signal(libc::SIGTERM);
    }

    /// SIGTERMs node `id` (a controlled shutdown: it hands its leaderships over first) and waits
    /// up to `bound` for it to exit; returns how long that took.
    ///
    /// # Panics
    /// When it is still running after `bound` (it is then killed); a controlled shutdown can wait
    /// for minutes when the controller quorum is gone.
    pub fn terminate(&mut self, id: i32, bound: Duration) -> Duration {
        let began = Instant::now();
        let node = self.node_mut(id);
        node.signal(libc::SIGTERM);
        if node.wait_exit(bound).is_none() {
            node.kill();
            panic!(
                "node {id} did not finish its controlled shutdown within {bound:?}\n{}",
                self.node(id).log_tail(40)
            );
        }
        began.elapsed()
    }

    /// Starts node `id` again, on the same ports and data, after [`KafkaCluster::kill`] or
    /// [`KafkaCluster::terminate`], and waits until it is ready and, if every node runs, back in
    /// every partition's in-sync replicas.
    ///
    /// # Panics
    /// When the node still runs, or is not ready within 180 s.
    pub fn restart(&mut self, id: i32) {
        let node = self.node_mut(id);
        // A node that died by itself is forgotten here and may be restarted too.
        let _ = node.exited();
        assert!(node.pid().is_none(), "node {id} still runs; kill it first");
        if let Err(e) = self.launch(&[id]) {
            panic!("{e}");
        }
    }

    /// Makes node `ids[p % n]` (ids in order) the leader, and so the group coordinator, of
    /// `__consumer_offsets` partition `p`, creating the topic first if no FindCoordinator has,
    /// and returns once FindCoordinator says so for every partition. Tests that compare
    /// coordinators call it: the controller never makes a node that is fenced at the topic's
    /// creation (a missed heartbeat on a loaded machine) a partition's preferred leader, so
    /// left alone one node may coordinate every group for good.
    ///
    /// # Panics
    /// When a node is down, or the move does not complete within the admin and failover bounds.
    pub fn spread_offsets_leaders(&self) {
        assert!(
            self.nodes.iter().all(|n| n.is_live()),
            "spreading the offsets partitions' leaders needs every node"
        );
        let partitions = self.offsets_partitions();
        let probes: Vec<String> = (0..partitions)
            .map(|p| group_on_partition("kafka-lock-tests-spread", p, partitions))
            .collect();
        // The first FindCoordinator creates the topic; only in-sync replicas can be elected.
        self.coordinator(&probes[0]);
        self.wait_for_full_isr();
        super::admin::spread_leaders(&self.bootstrap(), "__consumer_offsets");
        let ids: Vec<i32> = self.nodes.iter().map(|n| n.id()).collect();
        for (p, group) in probes.iter().enumerate() {
            let want = ids[p % ids.len()];
            self.poll_coordinator(group, |id| id == want);
        }
    }

    /// The node FindCoordinator names for `group`, asked of the live nodes in turn until one
    /// answers without error.
    ///
    /// # Panics
    /// When no live node answers within 60 s.
    pub fn coordinator(&self, group: &str) -> i32 {
        self.poll_coordinator(group, |_| true)
    }

    /// Waits until FindCoordinator names a live node other than `old` as `group`'s coordinator,
    /// and returns it.
    ///
    /// # Panics
    /// When that does not happen within 60 s.
    pub fn wait_for_new_coordinator(&self, group: &str, old: i32) -> i32 {
        self.poll_coordinator(group, |id| {
            id != old && self.nodes.iter().any(|n| n.id() == id && n.is_live())
        })
    }

    fn poll_coordinator(&self, group: &str, accept: impl Fn(i32) -> bool) -> i32 {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            let mut answers = Vec::new();
            for node in self.nodes.iter().filter(|n| n.is_live()) {
                let answer = find_coordinator(&node.addr(), group);
                match &answer {
                    Ok(found) if accept(found.node_id) => return found.node_id,
                    _ => answers.push(format!("node {}: {answer:?}", node.id())),
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "no acceptable coordinator for {group} within {FAILOVER_TIMEOUT:?}; last \
                     answers:\n{}",
                    answers.join("\n")
                );
            }
            // Polling: the coordinator moves when the controller fences a broker, which no
            // client can subscribe to.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        // A failing test unwinds through here: the brokers' view of it is worth printing while
        // the logs still exist (libtest shows it with the test's output).
        // A failing test unwinds through here, and the brokers' logs are about to be removed
        // with their directory (libtest shows this with the test's output).
        if std::thread::panicking() {
            for node in &self.nodes {
                eprintln!("{}", node.log_tail(20));
            }
            eprintln!("whole logs kept in {}", self.keep_logs().display());
        }
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Distinct free loopback ports: all bound at once so none repeats, then released for the
/// brokers to bind (another process can win that race; [`KafkaCluster::start`] retries).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0")
                .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"))
        })
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

/// A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (22 characters), not
/// starting with '-', which the storage tool would read as an option.
fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut urandom = std::fs::File::open("/dev/urandom").expect("open /dev/urandom");
    loop {
        let mut bytes = [0u8; 16];
        urandom.read_exact(&mut bytes).expect("read /dev/urandom");
        // 16 bytes = 128 bits: 21 full sextets, then 2 bits padded with zeros to a 22nd.
        let bits = u128::from_be_bytes(bytes);
        let mut id: String = (1..=21)
            .map(|i| ALPHABET[((bits >> (128 - 6 * i)) & 0x3f) as usize] as char)
            .collect();
        id.push(ALPHABET[((bits & 0x3) << 4) as usize] as char);
        if !id.starts_with('-') {
            return id;
        }
    }
}

#[test]
fn cluster_ids_are_22_url_safe_characters() {
    for _ in 0..100 {
        let id = new_cluster_id();
        assert_eq!(id.len(), 22, "{id}");
        assert!(!id.starts_with('-'), "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{id}"
        );
        // The 22nd character carries only 2 bits; the rest of it is zero padding.
        let last = id.as_bytes()[21];
        assert!(b"AQgw".contains(&last), "{id}");
    }
}
