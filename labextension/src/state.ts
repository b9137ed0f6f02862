/**
 * What a kernel's state means for people: labels, severities, the status bar
 * text and the split of a card's capacity. Pure functions (tested with node).
 */
import {
  basename,
  cardLabel,
  formatMiB,
  formatUsage,
  isMeasured,
  Stack
} from './format';
import type { ICard, IKernel } from './types';

export type Severity = 'ok' | 'info' | 'warn' | 'error' | 'muted';

export interface IStateView {
  /** Normalised state, including client-side near/over quota when measured. */
  state: string;
  /** Short badge text, e.g. "queued #2". */
  label: string;
  /** One sentence for the panel. */
  detail: string;
  severity: Severity;
}

/** The fraction of its quota at which a running kernel counts as near quota. */
export const NEAR_QUOTA_DEFAULT = 0.9;

/** A kernel's quota in MiB: the framework cap, else the reservation less the context reserve. */
export function quotaMiB(k: IKernel): number | null {
  if (isMeasured(k.quota_mib)) {
    return k.quota_mib;
  }
  if (isMeasured(k.reserved_mib) && isMeasured(k.reserve_mib)) {
    return k.reserved_mib - k.reserve_mib;
  }
  return null;
}

/**
 * The state to show. The server's state wins; while the usage sampler does not
 * yet classify, a running kernel whose measured use passes its quota (or the
 * near fraction of it) is shown as over (near) quota.
 */
export function effectiveState(
  k: IKernel,
  nearFraction = NEAR_QUOTA_DEFAULT
): string {
  const s = k.state;
  if (s === 'running') {
    const q = quotaMiB(k);
    if (isMeasured(k.used_mib) && q !== null && q > 0) {
      if (k.used_mib > q) {
        return 'over_quota';
      }
      if (k.used_mib >= q * nearFraction) {
        return 'near_quota';
      }
    }
  }
  return s;
}

export function describeState(
  k: IKernel,
  nearFraction = NEAR_QUOTA_DEFAULT
): IStateView {
  const state = effectiveState(k, nearFraction);
  const q = quotaMiB(k);
  switch (state) {
    case 'starting':
      return {
        state,
        label: 'starting',
        detail: 'Reserving GPU memory for this kernel…',
        severity: 'info'
      };
    case 'queued': {
      const pos = isMeasured(k.position) ? ` #${k.position}` : '';
      const parts = [`Waiting for a GPU${pos ? `: position${pos}` : ''}`];
      if (isMeasured(k.need_mib)) {
        parts.push(`needs ${formatMiB(k.need_mib)}`);
      }
      if (isMeasured(k.free_mib)) {
        parts.push(`${formatMiB(k.free_mib)} unreserved now`);
      }
      return {
        state,
        label: `queued${pos}`,
        detail: `${parts.join(', ')}. It starts by itself when a kernel frees room.`,
        severity: 'warn'
      };
    }
    case 'running':
      return {
        state,
        label: 'running',
        detail: 'Running on its GPU quota.',
        severity: 'ok'
      };
    case 'near_quota':
      return {
        state,
        label: 'near quota',
        detail: `Uses ${formatUsage(k.used_mib, q)} of its quota; the next large allocation may fail with out-of-memory.`,
        severity: 'warn'
      };
    case 'over_quota':
      return {
        state,
        label: 'over quota',
        detail: `Uses ${formatUsage(k.used_mib, q)}: more than its quota. Free memory (del large arrays, restart) or ask for a larger quota.`,
        severity: 'error'
      };
    case 'idle':
      return {
        state,
        label: 'idle',
        detail:
          'Holds GPU memory without using the GPU. Shut it down to give the memory back to others.',
        severity: 'warn'
      };
    case 'cpu':
      return {
        state,
        label: 'cpu',
        detail: `Started without a GPU. ${k.reason ?? ''}`.trim(),
        severity: 'error'
      };
    case 'none':
      return {
        state,
        label: 'no GPU',
        detail:
          k.reason ??
          'This kind of kernel reserves no GPU memory, so it sees no GPU.',
        severity: 'muted'
      };
    case 'failed':
      return {
        state,
        label: 'not running',
        detail: k.reason ?? 'The kernel could not start again.',
        severity: 'error'
      };
    default:
      return {
        state,
        label: state || 'unknown',
        detail: k.reason ?? '',
        severity: 'muted'
      };
  }
}

/**
 * The status bar text for the current kernel.
 * `kernel` undefined: no kernel record (not started, or no session).
 */
export function statusText(
  kernel: IKernel | undefined,
  opts: { backend?: string | null; hasKernel?: boolean } = {}
): string {
  if (opts.backend === 'none') {
    return 'no GPU';
  }
  if (!kernel) {
    return opts.hasKernel ? 'GPU –' : 'GPU: no kernel';
  }
  switch (kernel.state) {
    case 'queued':
      return isMeasured(kernel.position)
        ? `GPU queued #${kernel.position}`
        : 'GPU queued';
    case 'starting':
      return 'GPU starting…';
    case 'cpu':
      return 'no GPU';
    case 'none':
      return 'GPU: no quota';
    case 'failed':
      return 'GPU: not running';
    default:
      return `GPU ${formatUsage(kernel.used_mib, quotaMiB(kernel))}`;
  }
}

/** A longer tooltip for the status bar item. */
export function statusTitle(kernel: IKernel | undefined): string {
  if (!kernel) {
    return 'GPU memory quota of this notebook’s kernel';
  }
  const s = describeState(kernel);
  const where = kernel.card ? ` on ${cardLabel(kernel.card)}` : '';
  const quota = kernel.quota ? `quota ${kernel.quota}${where}` : '';
  const used = isMeasured(kernel.used_mib)
    ? `, using ${formatMiB(kernel.used_mib)}`
    : ', usage not measured yet';
  return `${basename(kernel.path) || kernel.kernel_name}: ${s.label}${quota ? ` — ${quota}${used}` : ''}. ${s.detail}`;
}

export interface ISegment {
  key: 'mine' | 'unused' | 'others' | 'outside' | 'free' | 'headroom';
  label: string;
  mib: number;
  /** More for the tooltip. */
  detail?: string;
}

/**
 * A card's capacity split for the bar: my kernels, other kernels (an anonymous
 * total of their reservations), reserved but unused (only when use is
 * measured), memory that processes without a reservation use (a script in a
 * terminal: new kernels count it as taken), free, and the headroom the admin
 * keeps back. The segments sum to the card's total.
 */
export function cardSegments(card: ICard, mine: IKernel[]): ISegment[] {
  const total = Math.max(0, card.total_mib);
  const headroom = Math.max(0, total - card.usable_mib);
  const onCard = mine.filter(k => k.card?.uuid === card.uuid);
  const mineReserved = onCard.reduce(
    (s, k) => s + (isMeasured(k.reserved_mib) ? k.reserved_mib : 0),
    0
  );
  const othersReserved = Math.max(0, card.reserved_mib - mineReserved);
  const measured = isMeasured(card.used_by_kernels_mib);
  let mineUsed: number;
  let unused: number;
  let others = othersReserved;
  let outside = 0;
  if (measured) {
    mineUsed = card.used_by_kernels_mib as number;
    unused = Math.max(0, mineReserved - mineUsed);
    if (isMeasured(card.outside_mib)) {
      outside = card.outside_mib; // in no reserved kernel's process tree (the server matched them)
    } else if (isMeasured(card.used_by_others_mib)) {
      others = Math.max(othersReserved, card.used_by_others_mib); // a server that does not split it
    }
  } else {
    mineUsed = mineReserved;
    unused = 0;
  }
  const stack = new Stack(total);
  const segs: ISegment[] = [];
  const push = (
    key: ISegment['key'],
    label: string,
    mib: number,
    detail?: string
  ) => {
    segs.push({
      key,
      label,
      mib: stack.take(mib),
      ...(detail ? { detail } : {})
    });
  };
  push(
    'mine',
    measured ? 'my kernels (used)' : 'my kernels (reserved)',
    mineUsed
  );
  push('unused', 'reserved, unused', unused);
  // with the server's split, "others" are other kernels' reservations; without it, any other use
  push(
    'others',
    isMeasured(card.outside_mib) ? 'other kernels' : 'other users',
    others
  );
  push(
    'outside',
    'no reservation',
    outside,
    'used by processes that hold no reservation (a script in a terminal, a program started outside Jupyter); new kernels count it as taken until they exit'
  );
  push('headroom', 'kept free by the admin', headroom);
  push('free', 'free', stack.left);
  return segs;
}

/** Find the current notebook's kernel record: by kernel id, else by notebook path. */
export function findKernel(
  kernels: IKernel[],
  kernelId: string | null | undefined,
  path: string | null | undefined
): IKernel | undefined {
  if (kernelId) {
    const byId = kernels.find(k => k.kernel_id === kernelId);
    if (byId) {
      return byId;
    }
  }
  if (path) {
    // The server may hold an absolute path (JPY_SESSION_NAME) while the front end has a relative one.
    const norm = (p: string) => p.replace(/\\/g, '/');
    const rel = norm(path);
    return kernels.find(k => {
      if (!k.path) {
        return false;
      }
      const p = norm(k.path);
      // Only kernels not yet known by id (queued or starting) match by path.
      return (
        (p === rel || p.endsWith(`/${rel}`)) &&
        (k.state === 'queued' || k.state === 'starting' || !kernelId)
      );
    });
  }
  return undefined;
}
