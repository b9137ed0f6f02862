/**
 * How the server's judgment of a kernel is put on screen: the status bar's text,
 * its tooltip and level, and which record belongs to the notebook in front.
 * Nothing here decides a state: the server does (state.py), and every view
 * says its words. Pure functions (tested with node).
 */
import {
  basename,
  cardLabel,
  formatMiB,
  formatUsage,
  isMeasured
} from './format';
import type { IEvent, IKernel, IStatus } from './types';

/** The server's words for a kernel (a record from an older reply may lack them). */
export function statusOf(k: IKernel): IStatus {
  return (
    k.status ?? {
      label: String(k.state),
      detail: k.reason ?? '',
      severity: 'muted'
    }
  );
}

/**
 * What earlier runs of a kernel's notebook tell its student: what they peaked
 * at, and whether the quota was learned from them; null when it has no history.
 * A kernel without a notebook learns from earlier kernels of its kind.
 */
export function historyText(k: IKernel): string | null {
  if (!isMeasured(k.learned_peak_mib)) {
    return null;
  }
  const peak = formatMiB(k.learned_peak_mib);
  const own = k.learned_from !== 'others';
  const text = k.path
    ? `This notebook peaked at ${peak} ${own ? 'in your earlier runs' : 'when others ran it'}.`
    : `${own ? 'Your earlier' : 'Earlier'} ${k.kernel_name} kernels peaked at ${peak}.`;
  return k.quota_source === 'learned'
    ? `${text} Its quota was learned from earlier runs.`
    : text;
}

/** A kernel's quota in MiB (what its frameworks are capped at). */
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
 * The status bar's text for the notebook in front. Use is shown against the
 * kernel's reservation (quota + CUDA context), which is what the server judges
 * it by. `kernel` undefined: the server has no record of it.
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
      return `GPU ${formatUsage(kernel.used_mib, kernel.reserved_mib)}`;
  }
}

/** The status bar's tooltip: the notebook, the server's label and sentence. */
export function statusTitle(kernel: IKernel | undefined): string {
  if (!kernel) {
    return 'GPU memory quota of this notebook’s kernel';
  }
  const s = statusOf(kernel);
  const where = kernel.card ? ` on ${cardLabel(kernel.card)}` : '';
  const who = basename(kernel.path) || kernel.kernel_name;
  return `${who}: ${s.label}${where}. ${s.detail}`;
}

/**
 * The server's record of a notebook's kernel: by its kernel id, never by the
 * notebook's name (two notebooks may share one; a kernel in line has its id at
 * once, like any other).
 */
export function matchKernel(
  kernels: IKernel[],
  kernelId: string | null | undefined
): IKernel | undefined {
  return kernelId ? kernels.find(k => k.kernel_id === kernelId) : undefined;
}

export type NotifyType = 'info' | 'success' | 'warning' | 'error';

/**
 * How an event is announced, or null for events that only update the panel
 * (reserved, released, reclaimed, quota requested...).
 */
export function classifyEvent(kind: string): NotifyType | null {
  const k = kind.toLowerCase();
  if (k === 'admitted') {
    return 'success';
  }
  if (k === 'cancelled') {
    return 'info'; // a wait that ended on purpose (stopped, closed, left unwatched): said, not an error
  }
  if (k === 'refused' || k.includes('over') || k.includes('failed')) {
    return 'error';
  }
  if (
    k === 'no-gpu' ||
    k === 'queued' ||
    k.includes('near') ||
    k.includes('idle') ||
    k.includes('action') ||
    k.includes('restart') ||
    k.includes('shutdown') ||
    k.includes('kill')
  ) {
    return 'warning';
  }
  return null;
}

/** A notification's text: the notebook, what to do first, then what happened. */
export function eventText(e: IEvent, name: string | null): string {
  const who = name ?? 'A kernel';
  const head =
    e.kind === 'admitted'
      ? `${who}: GPU ready.`
      : e.kind === 'refused'
        ? `${who} was not started.`
        : `${who}:`;
  const advice = typeof e.advice === 'string' && e.advice ? ` ${e.advice}` : '';
  return `${head}${advice} ${e.message}`.trim();
}
