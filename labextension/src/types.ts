/**
 * Shapes of the /api/gpushare/ replies (jupyter_gpushare/server/api/openapi.yaml).
 *
 * Fields marked "sampler" come from the NVML usage sampler; they are absent or
 * null until it measures them, and the UI then says "usage not measured yet".
 */

export interface ICardRef {
  /** The GPU's NVML index; MIG instances of one GPU share it. */
  index: number;
  /** "GPU 0", or "GPU 0 MIG 3" for a MIG instance. */
  label?: string;
  mig_instance?: number | null;
  uuid: string;
  name: string;
  total_mib: number;
  simulated: boolean;
}

/** A part of a card's memory as the server splits it (state.py card_segments): they add up to the card. */
export interface ISegment {
  key: 'mine' | 'others' | 'over' | 'outside' | 'headroom' | 'free';
  label: string;
  mib: number;
  /** The tooltip: the figure and what it is. */
  title: string;
}

export interface ICard extends ICardRef {
  usable_mib: number;
  reserved_mib: number;
  unreserved_mib: number;
  kernels: number;
  allowed: boolean;
  /** What this server's own kernels reserve on it (GET /state). */
  mine_reserved_mib?: number;
  /** The card's memory as the bar shows it (GET /state). */
  segments?: ISegment[];
  // sampler
  used_mib?: number | null;
  used_by_kernels_mib?: number | null;
  used_by_others_mib?: number | null;
  /** What processes holding no reservation use: taken as well (null where the server cannot tell). */
  outside_mib?: number | null;
  free_mib?: number | null;
  utilization?: number | null;
}

export interface IFramework {
  capped: boolean;
  limit_mib?: number | null;
  detail?: string;
}

export type KernelState =
  | 'starting'
  | 'queued'
  | 'running'
  | 'near_quota'
  | 'over_quota'
  | 'idle'
  | 'cpu'
  | 'none'
  | 'failed'
  | 'parked'
  | 'standby';

/** A code with its figures: worded by the sidebar (words.ts) from the server's catalogue (words.py). */
export interface IParams {
  [name: string]: string | number | null | undefined;
}

/** The server's judgment of a kernel: a code (status.<code>.label/.detail) with figures, and a level. */
export interface IStatus {
  code:
    | 'queued'
    | 'over_quota'
    | 'near_quota'
    | 'idle'
    | 'running'
    | 'running_unmeasured'
    | 'wait_ended'
    | 'starting'
    | 'cpu'
    | 'none'
    | 'failed'
    | 'parked'
    | 'standby';
  params: IParams;
  severity: 'ok' | 'info' | 'warn' | 'error' | 'muted';
  /** The same in English, for logs and the CLI (the sidebar words the code). */
  label: string;
  detail: string;
}

/** Where a parked kernel's GPU state returns, what it held and gave back. */
export interface IParked {
  card_uuid: string;
  card_index: number;
  parked_mib: number;
  quota_mib: number;
  reserved_mib: number;
  since: number;
  park_s: number;
}

export interface IKernel {
  kernel_id: string;
  kernel_name: string;
  path?: string | null;
  language: string;
  user: string;
  state: KernelState;
  /** The quota it starts with or holds, in MiB (a share before it has a card: on the largest card). */
  requested_quota_mib?: number | null;
  /** A quota asked for, in MiB on its card, applied at the next restart (null: none asked). */
  pending_quota_mib?: number | null;
  /** Where the quota came from; 'learned' = from earlier runs of its notebook. */
  quota_source?: 'default' | 'kernelspec' | 'requested' | 'learned';
  /** What earlier runs of its notebook peaked at (null: no history). */
  learned_peak_mib?: number | null;
  /** Whose runs: the user's own, or others' (a teacher's, several users'). */
  learned_from?: 'own' | 'others' | null;
  quota_mib?: number | null;
  reserve_mib?: number | null;
  reserved_mib?: number | null;
  card?: ICardRef | null;
  position?: number | null;
  need_mib?: number | null;
  free_mib?: number | null;
  waited_s?: number | null;
  /** How much longer a queued kernel may wait before its start is refused (null: no limit). */
  wait_left_s?: number | null;
  /** A queued kernel: when its wait gives up (Unix time). */
  gives_up_at?: number | null;
  /** A queued kernel: when it is likely granted (Unix time), from past holds; null: not known. */
  likely_at?: number | null;
  /** Its wait for a GPU ended without one (the event's code): it runs on without a GPU. */
  wait_ended?: string | null;
  /** A queued kernel: its cell that waits for the GPU (heldcell.ts). */
  held_cell?: IHeldCell | null;
  reason?: string | null;
  /** A parked kernel: its GPU state is in host memory, its reservation went to the line. */
  parked?: IParked | null;
  /** The server's judgment in words (GET /state). */
  status?: IStatus;
  /** Recent use, [unix time, MiB] oldest first (GET /state). */
  history?: [number, number][];
  pid?: number | null;
  since?: number;
  /** A framework of the kernel ran out of memory: the quota to restart with (GET /state). */
  oom?: IOom | null;
  /** How the server holds the kernel, level by level (docs/admin-guide.md, Enforcement levels). */
  held?: IHeld;
  // sampler
  frameworks?: { [name: string]: IFramework } | null;
  used_mib?: number | null;
  peak_mib?: number | null;
  utilization?: number | null;
}

export interface IHeld {
  /** Every framework the kernel imported is capped (null: it imported none). */
  caps?: boolean | null;
  /** cgroup: whatever the kernel starts stays its own; tree: a daemon can leave its process tree. */
  tracking: 'cgroup' | 'tree';
  /** Its user may move its processes out of its cgroup (root, or a delegated subtree). */
  escapable?: boolean;
  card_isolation: boolean;
  /** What the next level needs, in words. */
  reason: string | null;
  /** The over-quota action (GpuShareApp.over_quota_action). */
  watchdog: 'notify' | 'interrupt' | 'restart' | 'shutdown' | 'protect' | null;
  /** How the card refuses it memory past its reservation (dmem: the driver's per-cgroup limit). */
  allocation?: 'dmem' | null;
  /** The enforcement level in one word (docs/security.md). */
  level?: 'caps' | 'watchdog' | 'cgroup' | 'allocation';
}

export interface IQueueEntry {
  position: number;
  kernel_id?: string | null;
  mine: boolean;
  /** Its quota in MiB (a share of a card: on the largest card); null when it cannot be read. */
  quota_mib: number | null;
  /** What it needs on a card: its quota + the CUDA context reserve (the banner's figure). */
  need_mib: number | null;
  waited_s: number;
}

export interface IEvent {
  time: number;
  kind: string;
  /** What happened, as a code (event.<code>; words.ts says an unknown one by its message). */
  code: string;
  /** Its figures, and the server's English `message`. */
  params: IParams;
  /** How it is announced; null: only the panel shows it. */
  severity: 'success' | 'info' | 'warning' | 'error' | null;
  kernel_id?: string | null;
  /** The kernel's notebook when the event happened (the kernel may be gone since). */
  path?: string | null;
  /** The server's English, for logs and the CLI. */
  message: string;
  [figure: string]: unknown;
}

/** A size as numbers: whole MiB, or a share of the kernel's card in %. */
export interface ISize {
  mib?: number;
  percent?: number;
}

export interface IConfig {
  default_quota?: ISize;
  max_quota?: ISize | null;
  min_quota?: ISize;
  context_reserve_mib?: number;
  card_headroom?: ISize;
  on_full?: 'queue' | 'cpu' | 'reject';
  queue_timeout_s?: number | null;
}

/** Per-user limits of the broker (policy.UserLimits.to_dict); null fields: no limit of that kind. */
export interface IUserLimits {
  /** Sum of the user's kernel quotas, e.g. "16 GiB" or "25%" (of a card). */
  max_total?: string | null;
  /** Largest quota of one kernel. */
  max_kernel?: string | null;
  /** Most kernels holding GPU memory at once. */
  max_kernels?: number | null;
}

/** How much of their limits the user holds, judged by the server (views.limits_use). */
export interface ILimitsUse {
  quota_mib: number;
  /** max_total in MiB (a share read against the largest card); null: no such limit. */
  max_total_mib: number | null;
  max_kernel_mib: number | null;
  kernels: number;
  max_kernels: number | null;
  /** A limit is reached: the next kernel, or a larger quota, would be refused. */
  full: boolean;
}

/** A card as GET /host shows it: everyone's reservations, split into mine and others'. */
export interface IHostCard extends ICardRef {
  /** The card's memory as the server splits it (the same words as the panel's cards). */
  segments?: ISegment[];
  usable_mib: number;
  reserved_mib: number;
  unreserved_mib: number;
  mine_reserved_mib: number;
  others_reserved_mib: number;
  allowed: boolean;
}

export interface IHostUser {
  user: string;
  kernels: number;
  quota_mib: number;
  reserved_mib: number;
}

export interface IHostKernel {
  kernel_id: string;
  kernel_name: string;
  user: string;
  card_index: number;
  card_uuid: string;
  card_label?: string;
  quota_mib: number;
  reserve_mib: number;
  reserved_mib: number;
  /** null where the broker cannot see the process (e.g. a server in a container). */
  server_pid?: number | null;
  kernel_pid?: number | null;
  age_s: number;
  /** Its notebook, as its server said (a broker's admin's view); else null. */
  notebook?: string | null;
}

/** A teacher's action on a kernel of the host (POST /api/gpushare/host/kernels/<id>). */
export type HostAction = 'front' | 'remove' | 'release';

/** The kernel a teacher acts on, as the host view names it. */
export interface IHostTarget {
  kernelId: string;
  name: string;
  user: string;
}

/** A place in the host queue; another user's entry has null names (a student's view). */
export interface IHostQueueEntry {
  position: number;
  mine: boolean;
  kernel_id?: string | null;
  kernel_name?: string | null;
  user?: string | null;
  /** Another user's entry: null (a student's view). */
  quota_mib?: number | null;
  need_mib?: number | null;
  waited_s: number;
  /** Its notebook, as its server said (a broker's admin's view); else null. */
  notebook?: string | null;
}

/** GET /api/gpushare/host: the host as this server's user may see it (broker.view_for). */
export interface IHostView {
  user: string;
  admin: boolean;
  limits?: IUserLimits | null;
  limits_use?: ILimitsUse | null;
  context_reserve_mib?: number;
  cards: IHostCard[];
  users?: IHostUser[];
  kernels: IHostKernel[];
  queue: IHostQueueEntry[];
}

/** GET /api/gpushare/state: everything the sidebar, status bar and notifications show, judged by the server. */
export interface IState {
  version: string;
  backend: 'nvml' | 'simulated' | 'none';
  simulated: boolean;
  reason?: string | null;
  ledger?: {
    path?: string | null;
    broker?: string | null;
    error?: string | null;
    replaced?: string | null;
  };
  cards: ICard[];
  kernels: IKernel[];
  queue: IQueueEntry[];
  events: IEvent[];
  config: IConfig;
  sampler?: { time?: number | null; error?: string | null };
}

/** A framework of the kernel ran out of GPU memory (the server offers a restart with more). */
export interface IOom {
  framework: 'cupy' | 'jax' | 'tensorflow' | 'torch';
  retry_quota_mib: number | null;
}

/** A queued kernel's cell that waits for the GPU, as the kernel said it. */
export interface IHeldCell {
  /** The execute request's message id: its outputs come with it as their parent. */
  msg_id: string;
  /** FNV-1a (32 bits, 8 hex digits) of the cell's code as UTF-8. */
  hash: string;
  count: number | null;
}
