//! Running the agent: one pinned glommio executor per shard, and three plain threads around
//! them: the pinglist watcher (inotify), the sealer (zstd and quota, so that compression never
//! runs on a shard's core), and the main thread waiting for SIGTERM.
//!
//! Shards share nothing but [`Control`]: a stop flag and the current pinglist behind a
//! generation counter they check with one atomic load per round.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use glommio::{LocalExecutorBuilder, Placement};
use rocemesh_formats::keys::FleetKeys;
use rocemesh_formats::pinglist::Pinglist;
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity, enforce_quota, seal};

use crate::clock::now_ns;
use crate::config::{AgentConfig, Mode, ShardConfig, TransportKind};
use crate::live::{AgentCounters, LiveShard};
use crate::service::ServiceEvent;
use crate::shard::{AddError, Resolve, Shard, ShardParams, UdpResolver};
use crate::stats::ShardStats;
use crate::transport::{DropReason, Transport};
use crate::udp::{UdpTransport, unspecified_like};
use crate::verbs::{VerbsAddr, VerbsConfig, VerbsResolver, VerbsTransport};

/// glommio's reactor refuses to start below this (its MIN_MEMLOCK_LIMIT).
const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;
/// The agent does no storage I/O through glommio: its minimum.
const GLOMMIO_IO_MEMORY_BYTES: usize = 64 * 1024;
/// Event mode sends the probes due within this window together (see `ShardParams`).
const EVENT_SEND_AHEAD_NS: u64 = 1_000_000;
/// Longest an event-mode shard sleeps, so that stop and reload are seen within this.
const MAX_WAIT: Duration = Duration::from_millis(10);
/// How often a shard copies its counters into its live state (what a scrape can lag by).
const PUBLISH_EVERY_NS: u64 = 250_000_000;

static STOP_SIGNAL: AtomicBool = AtomicBool::new(false);

/// Whether SIGINT or SIGTERM asked the agent to stop.
pub fn stop_signalled() -> bool {
    STOP_SIGNAL.load(Ordering::Relaxed)
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP_SIGNAL.store(true, Ordering::SeqCst);
}

/// What shards share.
#[derive(Debug)]
pub struct Control {
    stop: AtomicBool,
    /// Shards that have bound their socket; probing starts when all have (or one failed), so
    /// that an agent's first probes do not hit its own not-yet-bound shards.
    ready: std::sync::atomic::AtomicUsize,
    failed: AtomicBool,
    generation: AtomicU64,
    pinglist: Mutex<Published>,
    shards: usize,
    /// The fleet keys in force (`[auth] keys`), and a counter bumped when they change.
    keys: Mutex<Option<Arc<FleetKeys>>>,
    keys_generation: AtomicU64,
}

/// The pinglist in force until every shard has built its tables from it; then it is dropped.
/// Parsing 10k targets leaves their strings scattered over ~40 MB of freed parser memory
/// that no trim can return while they live: 14 MB of an agent's 27 MB RSS.
#[derive(Debug)]
struct Published {
    pinglist: Option<Arc<Pinglist>>,
    /// Shards that have not loaded it yet.
    unloaded: usize,
}

impl Control {
    fn slot(&self) -> std::sync::MutexGuard<'_, Published> {
        self.pinglist.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pinglist to load; `None` once every shard has loaded it.
    fn current(&self) -> Option<Arc<Pinglist>> {
        self.slot().pinglist.clone()
    }

    fn publish(&self, p: Pinglist) {
        let generation = p.generation;
        *self.slot() = Published { pinglist: Some(Arc::new(p)), unloaded: self.shards };
        self.generation.store(generation.wrapping_add(1), Ordering::Release);
    }

    /// A shard has built its tables from `p`; the last one to do so drops it.
    fn loaded(&self, p: Arc<Pinglist>) {
        let mut slot = self.slot();
        if slot.pinglist.as_ref().is_some_and(|q| Arc::ptr_eq(q, &p)) {
            slot.unloaded = slot.unloaded.saturating_sub(1);
            if slot.unloaded == 0 {
                slot.pinglist = None;
                drop(slot);
                drop(p);
                release_freed_memory();
            }
        }
    }

    fn publish_keys(&self, k: FleetKeys) {
        *self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(k));
        self.keys_generation.fetch_add(1, Ordering::Release);
    }

    fn current_keys(&self) -> Option<Arc<FleetKeys>> {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Ask every shard to finish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || STOP_SIGNAL.load(Ordering::Relaxed)
    }
}

/// Final counters of one shard.
#[derive(Debug, Clone)]
pub struct ShardReport {
    /// Its device.
    pub device: String,
    /// Its counters.
    pub stats: ShardStats,
}

/// Check the limits glommio needs before starting anything, with an error that names the limit.
pub fn check_limits() -> Result<()> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < MEMLOCK_MIN_BYTES {
        bail!(
            "RLIMIT_MEMLOCK is {} KiB; the agent's io_uring reactor needs at least {} KiB per process: \
             raise it with `ulimit -l {}` or `LimitMEMLOCK={}K` in the systemd unit",
            lim.rlim_cur / 1024,
            MEMLOCK_MIN_BYTES / 1024,
            MEMLOCK_MIN_BYTES / 1024 * 4,
            MEMLOCK_MIN_BYTES / 1024 * 4
        );
    }
    Ok(())
}

/// Run until SIGTERM/SIGINT, `control.stop()`, or `duration` elapses. The calling thread is
/// the agent's main thread: after the privileged setup it drops its capabilities ([`crate::caps`]).
pub fn run(cfg: &AgentConfig, duration: Option<Duration>) -> Result<Vec<ShardReport>> {
    check_limits()?;
    install_signal_handlers()?;
    let control = load_control(cfg)?;
    let epoch = random_u32();
    tracing::info!(host = %cfg.host, epoch = format_args!("{epoch:08x}"), shards = cfg.shards.len(), mode = ?cfg.mode, "agent starting");

    // Privileged setup first, in this thread: path tracing's raw sockets (CAP_NET_RAW) and the
    // service tracer's thread, which loads its eBPF programs (CAP_BPF, CAP_PERFMON) and then
    // drops its own capabilities. Then this thread drops its own, before it starts any other
    // thread, so that the shards, glommio's helpers, the sealer, the watcher and the metrics
    // thread hold only CAP_IPC_LOCK, and that only when verbs shards may register memory again.
    let mut path_tracers: Vec<Option<crate::pathtrace::PathTracer>> =
        cfg.shards.iter().map(|sc| if cfg.path_tracing.enabled { open_path_tracer(cfg, sc) } else { None }).collect();
    let (mut service_rx, tracer) = start_service_tracer(cfg)?;
    drop_capabilities(cfg);

    let counters = Arc::new(AgentCounters::default());
    let lives: Vec<Arc<LiveShard>> = cfg.shards.iter().map(|s| Arc::new(LiveShard::new(&s.device, &s.tor))).collect();
    // Bound before anything runs: a taken port is a start-up error, not a silent agent.
    let _metrics = start_metrics(cfg, &lives, &counters)?;
    let (mut views, view) = start_view(cfg, epoch)?;
    let (seal_tx, sealer) = start_sealer(cfg, &counters)?;
    let mut watched = vec![Watched::Pinglist(cfg.pinglist.clone())];
    watched.extend(cfg.auth.keys.clone().map(Watched::Keys));
    spawn_watcher(watched, control.clone(), counters.clone())?;

    let mut handles = Vec::new();
    for i in 0..cfg.shards.len() {
        let ctx = OwnedShardContext {
            cfg: cfg.clone(),
            sc: cfg.shards[i].clone(),
            control: control.clone(),
            seal_tx: seal_tx.clone(),
            services: service_rx[i].take(),
            live: lives[i].clone(),
            path_tracer: path_tracers[i].take(),
            view: views[i].take(),
        };
        handles.push(spawn_shard(i, ctx, shard_params(cfg, i, epoch))?);
    }
    drop(seal_tx);

    let reports = wait_for_shards(&control, handles, duration);
    tracer.signal_stop();
    view.signal_stop();
    view.join("view");
    tracer.join("service tracer");
    if sealer.join().is_err() {
        tracing::error!("the sealer thread panicked");
    }
    for r in &reports {
        log_stats(&r.device, &r.stats, true);
    }
    Ok(reports)
}

/// The pinglist and the fleet keys the configuration names, loaded and checked, as the shared
/// state the shards and the watcher start from.
fn load_control(cfg: &AgentConfig) -> Result<Arc<Control>> {
    let pinglist = match Pinglist::load(&cfg.pinglist) {
        Ok(p) => p,
        Err(e) => bail!("{e}\n(the agent will not start on an invalid pinglist; `agent check-config` shows the same)"),
    };
    release_freed_memory();
    let keys = match &cfg.auth.keys {
        Some(path) => match FleetKeys::load(path) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => bail!(
                "{e}\n(the agent will not start without the fleet keys its config names in [auth] keys: \
                 its peers would refuse every packet)"
            ),
        },
        None => None,
    };
    Ok(Arc::new(Control {
        stop: AtomicBool::new(false),
        ready: std::sync::atomic::AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        generation: AtomicU64::new(pinglist.generation.wrapping_add(1)),
        pinglist: Mutex::new(Published { pinglist: Some(Arc::new(pinglist)), unloaded: cfg.shards.len() }),
        shards: cfg.shards.len(),
        keys: Mutex::new(keys),
        keys_generation: AtomicU64::new(1),
    }))
}

/// An optional helper thread (the service tracer, the one-sided view) and the flag that stops it.
struct Helper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Helper {
    fn new() -> Helper {
        Helper { stop: Arc::new(AtomicBool::new(false)), thread: None }
    }

    fn signal_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn join(self, what: &str) {
        if let Some(t) = self.thread
            && t.join().is_err()
        {
            tracing::error!("the {what} thread panicked");
        }
    }
}

/// Service tracing: one queue per shard, fed by the tracer thread. Without tracing there are
/// no queues, and shards do not look for events.
fn start_service_tracer(cfg: &AgentConfig) -> Result<(Vec<Option<mpsc::Receiver<ServiceEvent>>>, Helper)> {
    let mut service_rx: Vec<Option<mpsc::Receiver<ServiceEvent>>> = cfg.shards.iter().map(|_| None).collect();
    let mut tracer = Helper::new();
    if cfg.service_tracing.enabled {
        let mut links = Vec::new();
        for (sc, rx) in cfg.shards.iter().zip(&mut service_rx) {
            let (tx, r) = mpsc::sync_channel(crate::tracer::SHARD_QUEUE);
            *rx = Some(r);
            // A shard probes from the RoCEv2 GID of its bind address (verbs) or from that address.
            let gid = rocemesh_formats::gid::gid_bytes(sc.bind.ip());
            links.push(crate::tracer::ShardLink { device: sc.device.clone(), gid, tx });
        }
        let (st, stop) = (cfg.service_tracing.clone(), tracer.stop.clone());
        tracer.thread = Some(crate::tracer::spawn(st, links, stop, &STOP_SIGNAL, cfg.stats_interval_s)?);
    }
    Ok((service_rx, tracer))
}

/// This thread's capabilities, dropped after the privileged setup: all but CAP_IPC_LOCK, and that
/// only when verbs shards may register memory again.
fn drop_capabilities(cfg: &AgentConfig) {
    let keep = if cfg.shards.iter().any(|s| s.transport == TransportKind::Verbs) {
        1u64 << crate::caps::CAP_IPC_LOCK
    } else {
        0
    };
    crate::caps::drop_or_say("main", keep);
    tracing::info!(kept = ?crate::caps::names(keep), "capabilities dropped after setup");
}

/// The /metrics endpoint, when `[metrics] listen` is set: bound here, served by its own thread.
fn start_metrics(
    cfg: &AgentConfig,
    lives: &[Arc<LiveShard>],
    counters: &Arc<AgentCounters>,
) -> Result<Option<crate::exporter::Endpoint>> {
    let Some(listen) = cfg.metrics.listen else { return Ok(None) };
    let sources = crate::exporter::Sources {
        host: cfg.host.clone(),
        mode: match cfg.mode {
            Mode::Event => "event".into(),
            Mode::BusyPoll => "busy_poll".into(),
        },
        shards: lives.iter().zip(&cfg.shards).map(|(l, s)| (l.clone(), cfg.segment_dir.join(&s.device))).collect(),
        agent: counters.clone(),
        sysfs: cfg.metrics.sysfs.clone(),
        infiniband_prefix: cfg.metrics.infiniband_prefix.clone(),
    };
    Ok(Some(crate::exporter::spawn(listen, sources)?))
}

/// The shards' live views and the thread that serves them (verbs shards; `[view]`).
fn start_view(cfg: &AgentConfig, epoch: u32) -> Result<(Vec<Option<crate::view::ViewPublisher>>, Helper)> {
    let views: Vec<Option<crate::view::ViewPublisher>> = cfg
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (cfg.view.enabled() && s.transport == TransportKind::Verbs).then(|| {
                crate::view::ViewPublisher::new(&cfg.host, cfg.view.window_s * 1_000_000_000, shard_epoch(epoch, i))
            })
        })
        .collect();
    if cfg.view.enabled() {
        for s in cfg.shards.iter().filter(|s| s.transport != TransportKind::Verbs) {
            tracing::warn!(device = %s.device, "[view] is for verbs shards: this UDP shard has no view");
        }
    }
    let mut view = Helper::new();
    if views.iter().any(Option::is_some) {
        let served = views
            .iter()
            .zip(&cfg.shards)
            .filter_map(|(v, s)| {
                v.as_ref().map(|v| crate::verbs::view::ViewShard {
                    device: s.device.clone(),
                    bind: s.bind.ip(),
                    region: v.region(),
                })
            })
            .collect();
        view.thread = Some(
            crate::verbs::view::spawn(served, &cfg.view, view.stop.clone(), &STOP_SIGNAL, cfg.stats_interval_s)
                .map_err(|e| anyhow::anyhow!("[view]: {e} (remove [view] allow to run without a view)"))?,
        );
    }
    Ok((views, view))
}

/// The sealer thread, and the channel shards hand their closed segments to; segments a previous
/// run left open or unsealed are queued first.
fn start_sealer(
    cfg: &AgentConfig,
    counters: &Arc<AgentCounters>,
) -> Result<(mpsc::Sender<PathBuf>, std::thread::JoinHandle<()>)> {
    let (seal_tx, seal_rx) = mpsc::channel::<PathBuf>();
    // Each shard writes into its own sub-directory and gets an equal share of the quota, so
    // that one busy shard cannot evict another's data.
    let share = (cfg.segment_quota_mib << 20) / cfg.shards.len() as u64;
    let level = cfg.zstd_level;
    let counters = counters.clone();
    let sealer = std::thread::Builder::new()
        .name("sealer".into())
        .spawn(move || sealer_loop(&seal_rx, share, level, &counters))?;
    for s in &cfg.shards {
        recover_leftovers(&cfg.segment_dir.join(&s.device), &seal_tx);
    }
    Ok((seal_tx, sealer))
}

/// What shard `i` is told at start, from the agent's and its own configuration.
fn shard_params(cfg: &AgentConfig, i: usize, epoch: u32) -> ShardParams {
    let sc = &cfg.shards[i];
    ShardParams {
        host: cfg.host.clone(),
        device: sc.device.clone(),
        tor: sc.tor.clone(),
        addr: if sc.bind.ip().is_unspecified() { [0; 16] } else { rocemesh_formats::gid::gid_bytes(sc.bind.ip()) },
        epoch: shard_epoch(epoch, i),
        default_port: sc.bind.port(),
        flush_interval_ns: cfg.flush_interval_ms * 1_000_000,
        ignore_probe_fraction: sc.ignore_probe_fraction,
        send_ahead_ns: match cfg.mode {
            Mode::Event => EVENT_SEND_AHEAD_NS,
            Mode::BusyPoll => 0,
        },
        service_max_targets: cfg.service_tracing.max_targets_per_shard,
        service_new_per_s: cfg.service_tracing.max_new_targets_per_s,
        service_interval_ns: (1e9 / cfg.service_tracing.probe_pps) as u64,
        auth: cfg.auth.params(),
    }
}

/// What a shard's executor owns, moved into it at start ([`ShardContext`] borrows from it).
struct OwnedShardContext {
    cfg: AgentConfig,
    sc: ShardConfig,
    control: Arc<Control>,
    seal_tx: mpsc::Sender<PathBuf>,
    services: Option<mpsc::Receiver<ServiceEvent>>,
    live: Arc<LiveShard>,
    path_tracer: Option<crate::pathtrace::PathTracer>,
    view: Option<crate::view::ViewPublisher>,
}

/// Shard `i`'s glommio executor, pinned to its core, running [`shard_main`].
fn spawn_shard(
    i: usize,
    own: OwnedShardContext,
    params: ShardParams,
) -> Result<glommio::ExecutorJoinHandle<Result<ShardReport>>> {
    let (device, core) = (own.sc.device.clone(), own.sc.core);
    LocalExecutorBuilder::new(Placement::Fixed(core))
        .name(&format!("shard-{i}"))
        .io_memory(GLOMMIO_IO_MEMORY_BYTES)
        .spawn(move || async move {
            let OwnedShardContext { cfg, sc, control, seal_tx, services, live, path_tracer, view } = own;
            let shards = cfg.shards.len();
            let ctx = ShardContext {
                cfg: &cfg,
                sc: &sc,
                control: &control,
                seal_tx: &seal_tx,
                shards,
                services,
                live,
                path_tracer,
                view,
            };
            let r = shard_main(ctx, params).await;
            if r.is_err() {
                control.failed.store(true, Ordering::SeqCst);
            }
            r
        })
        .map_err(|e| anyhow::anyhow!("starting the executor of shard {device} on core {core}: {e}"))
}

/// Waits until the agent is asked to stop (a signal, `control.stop()`, `duration`), stops the
/// shards and collects their reports; a failed shard is logged, the others report.
fn wait_for_shards(
    control: &Control,
    handles: Vec<glommio::ExecutorJoinHandle<Result<ShardReport>>>,
    duration: Option<Duration>,
) -> Vec<ShardReport> {
    let started = std::time::Instant::now();
    loop {
        if duration.is_some_and(|d| started.elapsed() >= d) {
            control.stop();
        }
        if control.stopping() {
            control.stop();
            let mut reports = Vec::new();
            for h in handles {
                match h.join() {
                    Ok(Ok(r)) => reports.push(r),
                    Ok(Err(e)) => tracing::error!("shard failed: {e:#}"),
                    Err(e) => tracing::error!("shard executor failed: {e}"),
                }
            }
            return reports;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Shard `i`'s epoch: distinct per shard, as shards of one agent start their counters together
/// and equal sequence numbers from two probers must not meet at a responder.
fn shard_epoch(epoch: u32, i: usize) -> u32 {
    epoch.wrapping_add((i as u32).wrapping_mul(0x9E37_79B9)).max(1)
}

async fn shard_main(ctx: ShardContext<'_>, params: ShardParams) -> Result<ShardReport> {
    let sc = ctx.sc;
    match sc.transport {
        TransportKind::Udp => {
            let transport = UdpTransport::bind_with_source_ports(sc.bind, sc.source_ports)?;
            let null = unspecified_like(sc.bind.ip());
            run_shard(ctx, params, transport, &UdpResolver, null).await
        }
        TransportKind::Verbs => {
            let transport = VerbsTransport::open(VerbsConfig {
                device: sc.device.clone(),
                port: sc.ib_port,
                bind: sc.bind,
                gid_index: sc.gid_index,
                traffic_class: sc.traffic_class,
                sysfs: PathBuf::from("/sys"),
            })?;
            tracing::info!(device = %sc.device, qpn = transport.qpn(), "verbs transport ready");
            run_shard(ctx, params, transport, &VerbsResolver, VerbsAddr::NULL).await
        }
    }
}

/// What a shard's loop needs besides its transport.
struct ShardContext<'a> {
    cfg: &'a AgentConfig,
    sc: &'a ShardConfig,
    control: &'a Control,
    seal_tx: &'a mpsc::Sender<PathBuf>,
    shards: usize,
    /// Service targets from the tracer thread (when service tracing is on).
    services: Option<mpsc::Receiver<ServiceEvent>>,
    /// What the shard publishes for `/metrics`.
    live: Arc<LiveShard>,
    /// Its path tracer, opened by the main thread while it had CAP_NET_RAW.
    path_tracer: Option<crate::pathtrace::PathTracer>,
    /// Its live view (`[view]`, verbs shards), updated when it publishes.
    view: Option<crate::view::ViewPublisher>,
}

async fn run_shard<T: Transport>(
    ctx: ShardContext<'_>,
    params: ShardParams,
    transport: T,
    resolver: &impl Resolve<T::Addr>,
    null: T::Addr,
) -> Result<ShardReport> {
    let ShardContext { cfg, sc, control, seal_tx, shards, services, live, path_tracer, mut view } = ctx;
    control.ready.fetch_add(1, Ordering::SeqCst);
    // The loop's own timers are CLOCK_MONOTONIC: a step of the wall clock must not stop stats,
    // publishing or draining (the shard follows steps itself).
    let mono = crate::clock::monotonic_ns;
    let ready_by = mono() + 5_000_000_000;
    while control.ready.load(Ordering::SeqCst) < shards && !control.failed.load(Ordering::SeqCst) && mono() < ready_by {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    let mut wc = WriterConfig::new(cfg.segment_dir.join(&sc.device));
    wc.segment_bytes = cfg.segment_mib << 20;
    wc.max_age_ns = cfg.segment_max_age_s * 1_000_000_000;
    wc.summary_window_ns = cfg.summary_window_s * 1_000_000_000;
    wc.keep_summaries = !cfg.live.collectors.is_empty();
    // A record is written when its probe completes, up to the pinglist's timeout after it was
    // sent (at most MAX_TIMEOUT_MS, whatever a reload brings), and reaches the writer within a
    // flush interval: a window is closed no sooner.
    wc.summary_grace_ns =
        (u64::from(rocemesh_formats::pinglist::MAX_TIMEOUT_MS) + cfg.flush_interval_ms) * 1_000_000 + 1_000_000_000;
    let identity = WriterIdentity {
        host: cfg.host.clone(),
        device: sc.device.clone(),
        tor: sc.tor.clone(),
        agent_epoch: params.epoch,
        tool: concat!("rocemesh-agent ", env!("CARGO_PKG_VERSION")).into(),
    };
    let sender = rocemesh_formats::live::Sender {
        host: cfg.host.clone(),
        rnic: format!("{}/{}", cfg.host, sc.device),
        tor: sc.tor.clone(),
        agent_epoch: params.epoch,
    };
    let writer = SegmentWriter::new(wc, identity)?;
    let mut shard = Shard::new(params, transport, writer, null, live.clone());
    if !cfg.live.collectors.is_empty() {
        let p = crate::push::Pusher::new(cfg.live.collectors.clone(), sender)
            .with_context(|| format!("shard {}: opening the live push socket", sc.device))?;
        shard.set_pusher(p);
        tracing::info!(device = %sc.device, collectors = ?cfg.live.collectors, "live pushes on");
    }
    if let Some(t) = path_tracer {
        shard.set_path_tracer(t);
        tracing::info!(device = %sc.device, "path tracing on");
    }
    let mut seen_generation = control.generation.load(Ordering::Acquire);
    reload(&mut shard, control, &sc.device, resolver);
    // 0: the keys (if any) are installed at the first round.
    let mut seen_keys = 0;
    let stats_every_ns = cfg.stats_interval_s * 1_000_000_000;
    let mut next_stats = mono() + stats_every_ns;
    let mut next_publish = 0;
    let mut drain_until = u64::MAX;
    let coalesce_ns = cfg.event_coalesce_us * 1_000;
    let mut woke_ns = 0u64;
    loop {
        let now = mono();
        if drain_until == u64::MAX && control.stopping() {
            shard.begin_drain();
            drain_until = now + shard.timeout_ns() + 50_000_000;
        }
        if now >= drain_until {
            break;
        }
        let g = control.generation.load(Ordering::Acquire);
        if g != seen_generation {
            seen_generation = g;
            reload(&mut shard, control, &sc.device, resolver);
        }
        let k = control.keys_generation.load(Ordering::Acquire);
        if k != seen_keys {
            seen_keys = k;
            if let Some(keys) = control.current_keys() {
                shard.set_keys(&keys);
                let accepted: Vec<u8> = keys.keys.iter().map(|k| k.id).collect();
                match shard.send_key_id() {
                    Some(id) => tracing::info!(device = %sc.device, sending = id, ?accepted, "fleet keys in force"),
                    None => tracing::info!(
                        device = %sc.device,
                        ?accepted,
                        "fleet keys loaded; no key's sending time has come: sending unauthenticated until then"
                    ),
                }
            }
        }
        if let Some(rx) = &services {
            take_service_events(&mut shard, rx, &sc.device, resolver);
        }
        if let Err(e) = shard.step() {
            tracing::warn!(device = %sc.device, "segment write failed (records counted as dropped): {e}");
        }
        for p in shard.take_closed() {
            to_sealer(seal_tx, p);
        }
        let now = mono();
        if now >= next_publish {
            next_publish = now + PUBLISH_EVERY_NS;
            let stats = shard.publish();
            if let Some(v) = &mut view {
                v.update(&live, &stats, now_ns(), services.is_some(), drain_until != u64::MAX);
            }
        }
        if stats_every_ns > 0 && now >= next_stats {
            next_stats = now + stats_every_ns;
            log_stats(&sc.device, &shard.stats(), false);
        }
        match cfg.mode {
            Mode::BusyPoll => glommio::yield_if_needed().await,
            Mode::Event => {
                let wait_ns = shard.next_deadline_ns().saturating_sub(now_ns());
                if wait_ns == 0 {
                    continue;
                }
                // Interrupt moderation: sleep out the rest of the quiet time first (deadlines
                // still win), so that the wait below finds a batch instead of one packet.
                // A plain sleep on the shard's thread, as the wait below: a glommio timer cost
                // more CPU at 250 us than waking at once saved.
                let quiet_ns = (woke_ns + coalesce_ns).saturating_sub(mono()).min(wait_ns);
                if quiet_ns > 0 {
                    std::thread::sleep(Duration::from_nanos(quiet_ns));
                }
                let wait_ns = shard.next_deadline_ns().saturating_sub(now_ns());
                if wait_ns == 0 {
                    woke_ns = mono();
                    continue;
                }
                // poll(2) on the transport's descriptors, on the shard's own thread. The shard
                // is the only task on its executor, so blocking its thread is what the reactor
                // would do; glommio 0.9 could wait only on a socket (its fd-readiness source is
                // crate-private, and a verbs completion channel is a character device), and its
                // wait (a peek on a dup of the UDP socket) cost 1.1-1.7x the CPU per probe of
                // this one in event mode at 10k probes/s.
                let wait = Duration::from_nanos(wait_ns).min(MAX_WAIT);
                if shard.transport_mut().arm() {
                    poll_fds(shard.transport(), wait);
                }
                // Let glommio run its own housekeeping between waits.
                glommio::yield_if_needed().await;
                woke_ns = mono();
            }
        }
    }
    let stats = shard.publish();
    if let Some(v) = &mut view {
        v.update(&live, &stats, now_ns(), services.is_some(), true);
    }
    let device = sc.device.clone();
    for p in shard.finish()? {
        to_sealer(seal_tx, p);
    }
    Ok(ShardReport { device, stats })
}

/// A shard's path tracer, or why it has none, said once (probing goes on).
fn open_path_tracer(cfg: &AgentConfig, sc: &ShardConfig) -> Option<crate::pathtrace::PathTracer> {
    let std::net::IpAddr::V4(local) = sc.bind.ip() else {
        tracing::warn!(device = %sc.device, bind = %sc.bind, "path tracing is off for this shard: it traces IPv4 only");
        return None;
    };
    if local.is_unspecified() {
        tracing::warn!(device = %sc.device, bind = %sc.bind, "path tracing is off for this shard: give `bind` a specific address (traces carry it as their source)");
        return None;
    }
    match crate::pathtrace::PathTracer::open(local, cfg.path_tracing.params(), &sc.device) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(device = %sc.device, "path tracing is off for this shard: {e}");
            None
        }
    }
}

/// Service events queued by the tracer thread: a bounded number per round, so that a storm
/// cannot hold up probing (the queue's bound drops the rest, counted by the tracer).
fn take_service_events<T: Transport>(
    shard: &mut Shard<T>,
    rx: &mpsc::Receiver<ServiceEvent>,
    device: &str,
    resolver: &impl Resolve<T::Addr>,
) {
    for _ in 0..crate::tracer::SHARD_QUEUE {
        let Ok(ev) = rx.try_recv() else { return };
        match ev {
            ServiceEvent::Add(s) => match shard.add_service(&s, resolver) {
                Ok(name) => {
                    let delay_ms = crate::clock::monotonic_ns().saturating_sub(s.rtr_mono_ns) as f64 / 1e6;
                    tracing::info!(
                        device,
                        service = %name,
                        flow_label = s.flow_label,
                        discovery_delay_ms = format_args!("{delay_ms:.1}"),
                        "service target added"
                    );
                }
                // Counted in the shard's service stats; a refusal per connection is not news.
                Err(AddError::Refused(why)) => {
                    tracing::debug!(device, local_qpn = s.local_qpn, ?why, "service target refused");
                }
                Err(AddError::Address(e)) => {
                    tracing::warn!(device, local_qpn = s.local_qpn, "service target has no address: {e}");
                }
            },
            ServiceEvent::Remove { local_qpn, why } => {
                if shard.remove_service(local_qpn) {
                    tracing::info!(device, local_qpn, ?why, "service target removed");
                }
            }
        }
    }
}

/// Block until one of the transport's descriptors is readable or `wait` passes.
fn poll_fds<T: Transport>(t: &T, wait: Duration) {
    let mut fds = [0; 4];
    let n = t.wait_fds(&mut fds);
    let mut pfd = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 4];
    for i in 0..n {
        pfd[i].fd = fds[i];
    }
    let ts = libc::timespec { tv_sec: wait.as_secs() as libc::time_t, tv_nsec: wait.subsec_nanos() as libc::c_long };
    // SAFETY: `pfd` holds `n` valid entries (a closed or -1 descriptor only reports POLLNVAL or
    // is ignored); ppoll does not keep the pointers.
    unsafe { libc::ppoll(pfd.as_mut_ptr(), n as libc::nfds_t, &raw const ts, std::ptr::null()) };
}

fn reload<T: Transport>(shard: &mut Shard<T>, control: &Control, device: &str, resolver: &impl Resolve<T::Addr>) {
    // None: a newer one was published and every shard has loaded it already (this shard too,
    // at an earlier step), so there is nothing newer to load.
    let Some(p) = control.current() else { return };
    let problems = shard.load(&p, resolver);
    for pr in problems {
        tracing::warn!(device, "pinglist generation {}: {pr}", p.generation);
    }
    tracing::info!(device, generation = p.generation, targets = shard.target_count(), "pinglist in force");
    control.loaded(p);
}

fn log_stats(device: &str, s: &ShardStats, last: bool) {
    tracing::info!(
        device,
        final_ = last,
        sent = s.probes_sent,
        ok = s.ok,
        lost = s.lost,
        invalid = s.invalid,
        late = s.late,
        unknown = s.unknown,
        malformed = s.malformed,
        peer_down = s.peer_down,
        answered = s.answered,
        unreachable = s.unreachable,
        local_drops = s.local_drops.iter().sum::<u64>(),
        local_drops_by_reason = %ByReason(&s.local_drops, &DropReason::NAMES),
        acks_not_sent = s.acks_not_sent,
        recv_errors = s.recv_errors,
        tx_stamp_errors = s.tx_stamp_errors,
        write_errors = s.write_errors,
        inflight_overflow = s.inflight_overflow,
        slots_skipped = s.slots_skipped,
        records_dropped = s.records_dropped,
        summaries_written = s.summaries_written,
        summaries_dropped = s.summaries_dropped,
        summary_late_parts = s.summary_late_parts,
        live_windows_pushed = s.live.windows,
        live_push_sent = s.live.sent,
        live_push_failed = s.live.failed,
        live_not_taken = s.live.not_taken,
        live_paths_pushed = s.live.paths,
        live_paths_dropped = s.live.paths_dropped,
        services_active = s.services.active,
        services_peak = s.services.peak_active,
        services_added = s.services.added,
        services_removed = s.services.removed,
        services_refused_full = s.services.refused_full,
        services_refused_rate = s.services.refused_rate,
        traces_started = s.paths.started,
        traces_written = s.paths.written,
        traces_incomplete = s.paths.incomplete,
        traces_single_switch = s.paths.single_switch,
        traces_unreachable = s.paths.unreachable,
        traces_untraceable = s.paths.untraceable,
        trace_packets_sent = s.paths.packets_sent,
        trace_replies = s.paths.replies,
        trace_send_errors = s.paths.send_errors,
        trace_recv_errors = s.paths.recv_errors,
        trace_peers_full = s.paths.peers_full,
        trace_peers_retired = s.paths.peers_retired,
        trace_arrivals = s.trace_arrivals,
        duplicate_acks = s.duplicate_acks,
        clock_steps = s.clock_steps,
        send_key = s.send_key_id.map_or(-1, i32::from),
        auth_refused = s.auth_refused.iter().sum::<u64>(),
        auth_refused_by_reason = %ByReason(&s.auth_refused, &crate::auth::AuthRefusal::NAMES),
        probes_auth_refused = s.probes_auth_refused,
        refusals_sent = s.refusals_sent,
        refusals_held = s.refusals_held,
        auth_refusals_ignored = s.auth_refusals_ignored,
        "shard stats"
    );
}

/// Counts by reason, for the stats line: `name=n,...` for the reasons that happened.
struct ByReason<'a>(&'a [u64], &'a [&'a str]);

impl std::fmt::Display for ByReason<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (name, n) in self.1.iter().zip(self.0).filter(|(_, n)| **n > 0) {
            write!(f, "{}{name}={n}", if first { "" } else { "," })?;
            first = false;
        }
        Ok(())
    }
}

/// Evictions are logged at most this often per shard directory: once the quota is reached they
/// happen at every seal (860 lines an hour in the soak), and `rocemesh_segment_evictions_total`
/// counts each.
const EVICTION_LOG_EVERY: Duration = Duration::from_secs(600);

fn sealer_loop(rx: &mpsc::Receiver<PathBuf>, quota_bytes_per_shard: u64, level: i32, counters: &AgentCounters) {
    // Per directory: when evictions were last logged, and files and bytes evicted since.
    let mut evicted: std::collections::HashMap<PathBuf, (Option<std::time::Instant>, u64, u64)> =
        std::collections::HashMap::new();
    for path in rx {
        match seal(&path, level) {
            Ok(r) => {
                AgentCounters::add(&counters.segments_sealed, 1);
                tracing::debug!(path = %r.sealed_path.display(), records = r.records, bytes = r.sealed_bytes, "sealed")
            }
            Err(e) => {
                AgentCounters::add(&counters.seal_errors, 1);
                tracing::warn!("sealing {} failed (the open segment is kept): {e}", path.display())
            }
        }
        if let Some(sub) = path.parent() {
            match enforce_quota(sub, quota_bytes_per_shard) {
                Ok(ev) if ev.files_evicted > 0 => {
                    AgentCounters::add(&counters.evictions, ev.files_evicted);
                    AgentCounters::add(&counters.evicted_bytes, ev.bytes_evicted);
                    let e = evicted.entry(sub.to_path_buf()).or_insert((None, 0, 0));
                    e.1 += ev.files_evicted;
                    e.2 += ev.bytes_evicted;
                    if e.0.is_none_or(|t| t.elapsed() >= EVICTION_LOG_EVERY) {
                        tracing::warn!(
                            dir = %sub.display(),
                            files = e.1,
                            bytes = e.2,
                            "quota: evicted the oldest sealed segments before they were collected (logged at most \
                             every 10 min; collect more often, or raise segment_quota_mib)"
                        );
                        *e = (Some(std::time::Instant::now()), 0, 0);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("quota enforcement in {} failed: {e}", sub.display()),
            }
        }
    }
}

/// Segments a previous run left open (it crashed): seal them now; they are unlocked.
fn recover_leftovers(dir: &Path, seal_tx: &mpsc::Sender<PathBuf>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // First start: the shard creates its directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::error!("listing {} for segments a previous run left open failed: {e}", dir.display());
            return;
        }
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.to_string_lossy().ends_with(rocemesh_formats::segment::OPEN_SUFFIX) {
            tracing::info!(path = %p.display(), "sealing a segment left open by a previous run");
            to_sealer(seal_tx, p);
        }
    }
}

/// Hand a closed segment to the sealer thread. If that thread is gone (it panicked), the
/// segment stays on disk unsealed and the next start seals it: say so, once per segment.
fn to_sealer(seal_tx: &mpsc::Sender<PathBuf>, path: PathBuf) {
    if let Err(mpsc::SendError(p)) = seal_tx.send(path) {
        tracing::error!(path = %p.display(), "the sealer thread is gone: this segment stays open on disk and is sealed at the next start");
    }
}

fn install_signal_handlers() -> Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let prev = unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
        if prev == libc::SIG_ERR {
            bail!("installing the handler for signal {sig} failed: {}", std::io::Error::last_os_error());
        }
    }
    // A file-size limit (ulimit -f, LimitFSIZE) below the segment size must be a write error the
    // writer reports with its hint and survives, not a signal that kills the agent.
    // SAFETY: setting a signal's disposition to ignore.
    if unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) } == libc::SIG_ERR {
        bail!("ignoring SIGXFSZ failed: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A file the agent reloads when it changes.
#[derive(Debug, Clone)]
enum Watched {
    Pinglist(PathBuf),
    Keys(PathBuf),
}

impl Watched {
    fn path(&self) -> &Path {
        match self {
            Watched::Pinglist(p) | Watched::Keys(p) => p,
        }
    }

    fn reload(&self, control: &Control, counters: &AgentCounters) {
        match self {
            Watched::Pinglist(p) => reload_pinglist(p, control, counters),
            Watched::Keys(p) => reload_keys(p, control, counters),
        }
    }
}

/// Watch the directories of the pinglist and the key file (ctl replaces them by rename) and
/// publish every valid new version; an invalid one is logged with its file and line, and the
/// previous stays in force.
fn spawn_watcher(files: Vec<Watched>, control: Arc<Control>, counters: Arc<AgentCounters>) -> Result<()> {
    // SAFETY: plain syscalls; results checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        bail!(
            "inotify_init1 failed: {} (raise fs.inotify.max_user_instances if it is exhausted)",
            std::io::Error::last_os_error()
        );
    }
    for f in &files {
        let dir = f.path().parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        let cdir = CString::new(dir.as_os_str().as_bytes()).context("watched directory")?;
        let mask = libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO | libc::IN_CREATE;
        // SAFETY: valid descriptor and NUL-terminated path; a directory watched twice gets the
        // same watch back.
        if unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), mask) } < 0 {
            bail!(
                "watching {} (the directory of {}) failed: {}",
                dir.display(),
                f.path().display(),
                std::io::Error::last_os_error()
            );
        }
    }
    std::thread::Builder::new()
        .name("pinglist-watch".into())
        .spawn(move || watch_files(fd, &files, &control, &counters))?;
    Ok(())
}

/// The watcher thread: reload a file on every inotify event about its name. Should reading
/// the events fail, say so and fall back to polling the files rather than stop watching: an
/// agent that silently stopped taking pinglists would probe a stale mesh for months.
fn watch_files(fd: libc::c_int, files: &[Watched], control: &Control, counters: &AgentCounters) {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into our own buffer from our own descriptor.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            let e = if n == 0 { "end of file".to_string() } else { std::io::Error::last_os_error().to_string() };
            let names: Vec<String> = files.iter().map(|f| f.path().display().to_string()).collect();
            tracing::error!(
                "reading inotify events for {} failed ({e}); watching by polling every {} s instead",
                names.join(", "),
                PINGLIST_POLL.as_secs()
            );
            if fd >= 0 {
                // SAFETY: our descriptor, closed once.
                unsafe { libc::close(fd) };
            }
            poll_files(files, control, counters);
            return;
        }
        for f in files {
            let name = f.path().file_name().map(|n| n.as_bytes()).unwrap_or_default();
            if events_name(&buf[..n as usize], name) {
                f.reload(control, counters);
            }
        }
    }
}

/// How often the pinglist is checked when inotify has failed.
const PINGLIST_POLL: Duration = Duration::from_secs(2);

/// The fallback watcher: reload a file when its identity (inode, size, mtime) changes. ctl
/// replaces it by rename, so the inode changes with every push.
fn poll_files(files: &[Watched], control: &Control, counters: &AgentCounters) {
    use std::os::unix::fs::MetadataExt;
    let identity = |p: &Path| std::fs::metadata(p).map(|m| (m.ino(), m.size(), m.mtime_nsec(), m.mtime()));
    let mut seen: Vec<_> = files.iter().map(|f| identity(f.path()).ok()).collect();
    // Logged when it starts (a file that cannot be looked at is never reloaded), not per poll.
    let mut failing = vec![false; files.len()];
    while !control.stopping() {
        std::thread::sleep(PINGLIST_POLL);
        for (i, f) in files.iter().enumerate() {
            match identity(f.path()) {
                Ok(now) => {
                    failing[i] = false;
                    if seen[i] != Some(now) {
                        seen[i] = Some(now);
                        f.reload(control, counters);
                    }
                }
                Err(e) if !failing[i] => {
                    failing[i] = true;
                    tracing::error!("looking at {} failed ({e}); the version in force stays", f.path().display());
                }
                Err(_) => {}
            }
        }
    }
}

fn reload_keys(path: &Path, control: &Control, counters: &AgentCounters) {
    match FleetKeys::load(path) {
        Ok(k) => {
            AgentCounters::add(&counters.keys_reloads, 1);
            let ids: Vec<u8> = k.keys.iter().map(|k| k.id).collect();
            tracing::info!(keys = ?ids, "fleet keys reloaded");
            control.publish_keys(k);
        }
        Err(e) => {
            AgentCounters::add(&counters.keys_reload_errors, 1);
            tracing::error!("fleet keys not reloaded, the keys in force stay: {e}")
        }
    }
}

fn reload_pinglist(path: &Path, control: &Control, counters: &AgentCounters) {
    match Pinglist::load(path) {
        Ok(p) => {
            AgentCounters::add(&counters.pinglist_reloads, 1);
            tracing::info!(generation = p.generation, targets = p.targets.len(), "pinglist reloaded");
            control.publish(p);
            release_freed_memory();
        }
        Err(e) => {
            AgentCounters::add(&counters.pinglist_reload_errors, 1);
            tracing::error!("pinglist not reloaded, the previous one stays in force: {e}")
        }
    }
}

/// Whether any inotify event in `buf` is about the file `name`.
fn events_name(buf: &[u8], name: &[u8]) -> bool {
    let header = std::mem::size_of::<libc::inotify_event>();
    let mut off = 0;
    while off + header <= buf.len() {
        let len = u32::from_ne_bytes([buf[off + 12], buf[off + 13], buf[off + 14], buf[off + 15]]) as usize;
        let end = (off + header + len).min(buf.len());
        let ev_name = &buf[off + header..end];
        let ev_name = &ev_name[..ev_name.iter().position(|&b| b == 0).unwrap_or(ev_name.len())];
        if ev_name == name {
            return true;
        }
        off = end;
    }
    false
}

/// Parsing a large pinglist peaks far above what is kept (a 10k-target file: tens of MiB of
/// transient TOML tree); glibc keeps freed memory in its arenas unless asked to give it back.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n == 4 {
        u32::from_ne_bytes(b).max(1)
    } else {
        // No entropy source: time and pid still make a restart's epoch differ.
        ((now_ns() as u32) ^ std::process::id().rotate_left(16)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinglist(generation: u64) -> Pinglist {
        Pinglist {
            version: rocemesh_formats::pinglist::VERSION,
            host: "h0".into(),
            generation,
            generated_unix_ns: 0,
            timeout_ms: 500,
            targets: Vec::new(),
        }
    }

    fn control(shards: usize) -> Control {
        Control {
            stop: AtomicBool::new(false),
            ready: std::sync::atomic::AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            pinglist: Mutex::new(Published { pinglist: None, unloaded: 0 }),
            shards,
            keys: Mutex::new(None),
            keys_generation: AtomicU64::new(0),
        }
    }

    #[test]
    fn the_pinglist_is_dropped_once_every_shard_loaded_it_and_not_before() {
        let c = control(2);
        c.publish(pinglist(1));
        let first = c.current().expect("published");
        c.publish(pinglist(2));
        // A shard that loaded generation 1 does not count toward generation 2.
        c.loaded(first);
        let a = c.current().expect("still needed");
        assert_eq!(a.generation, 2);
        c.loaded(a);
        let b = c.current().expect("one shard has not loaded it");
        c.loaded(b);
        assert!(c.current().is_none(), "every shard loaded generation 2");
        c.publish(pinglist(3));
        assert_eq!(c.current().map(|p| p.generation), Some(3));
        assert_eq!(c.generation.load(Ordering::Acquire), 4);
    }

    #[test]
    fn a_failing_inotify_read_falls_back_to_polling_and_reloads_still_happen() {
        // f9b751e's watcher thread returned silently on a read error: the agent then kept its
        // pinglist forever. An invalid descriptor makes the very first read fail (EBADF).
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pinglist.toml");
        std::fs::write(&path, pinglist(1).to_toml_string().expect("toml")).expect("write");
        let c = Arc::new(control(1));
        let watcher = {
            let (c, path) = (c.clone(), path.clone());
            std::thread::spawn(move || watch_files(-1, &[Watched::Pinglist(path)], &c, &AgentCounters::default()))
        };
        std::thread::sleep(Duration::from_millis(200));
        let tmp = dir.path().join("pinglist.toml.tmp");
        std::fs::write(&tmp, pinglist(7).to_toml_string().expect("toml")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        let deadline = std::time::Instant::now() + PINGLIST_POLL * 3;
        while c.current().map(|p| p.generation) != Some(7) {
            assert!(std::time::Instant::now() < deadline, "the new pinglist was never loaded");
            std::thread::sleep(Duration::from_millis(50));
        }
        c.stop();
        watcher.join().expect("the watcher ends when the agent stops");
    }
}
