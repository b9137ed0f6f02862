/**
 * How the server's judgment of a kernel is put on screen: the status bar's text,
 * its tooltip and level, and which record belongs to the notebook in front.
 * Nothing here decides a state: the server does (state.py), and every view
 * says its words. Pure functions (tested with node).
 */
import { basename, cardLabel, formatUsage, isMeasured } from './format';
import type { IEvent, IKernel, IStatus } from './types';
import { say } from './words';

/** The server's judgment of a kernel, worded: its label, its sentence and its level. */
export interface IWorded {
  label: string;
  detail: string;
  severity: IStatus['severity'];
}

/** The server's judgment of a kernel in the sidebar's words (the server's English for a record without one). */
export function statusOf(k: IKernel): IWorded {
  const s = k.status;
  if (!s) {
    return {
      label: String(k.state),
      detail: k.reason ?? '',
      severity: 'muted'
    };
  }
  return {
    label: say(`status.${s.code}.label`, s.params),
    detail: say(`status.${s.code}.detail`, s.params),
    severity: s.severity
  };
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
  const own = k.learned_from !== 'others';
  const figures = { peak_mib: k.learned_peak_mib, kernel: k.kernel_name };
  const text = k.path
    ? say(own ? 'ui.history.own' : 'ui.history.others', figures)
    : say(own ? 'ui.history.kind_own' : 'ui.history.kind_others', figures);
  return k.quota_source === 'learned'
    ? `${text} ${say('ui.history.learned')}`
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
    return say('ui.statusbar.no_gpu');
  }
  if (!kernel) {
    return say(
      opts.hasKernel ? 'ui.statusbar.unknown' : 'ui.statusbar.no_kernel'
    );
  }
  switch (kernel.state) {
    case 'running':
    case 'near_quota':
    case 'over_quota':
    case 'idle':
      return say('ui.statusbar.usage', {
        usage: formatUsage(kernel.used_mib, kernel.reserved_mib)
      });
    case 'cpu':
    case 'none':
      return say('ui.statusbar.no_gpu');
    case 'standby': // (its label already names the GPU)
      return say('ui.statusbar.first_use');
    default:
      return say('ui.statusbar.label', { label: statusOf(kernel).label });
  }
}

/**
 * What JupyterLab's own kernel status adds for a kernel (its name in the notebook's toolbar, and the status bar's
 * "Python 3 (ipykernel) | Idle"): that its GPU waits, or is parked; '' otherwise. The process itself is idle or
 * busy as JupyterLab says: a kernel runs from its start, whether or not it holds a GPU.
 */
export function kernelNote(kernel: IKernel | undefined): string {
  if (kernel?.state === 'queued' || kernel?.state === 'parked') {
    return say(`ui.kernel_note.${kernel.state}`, {
      label: statusOf(kernel).label
    });
  }
  return '';
}

/** Show `note` after JupyterLab's kernel status inside `node` (style/base.css), or take it away. */
export function setKernelNote(node: HTMLElement, note: string): void {
  if (note) {
    node.dataset.gpushareNote = note;
    // a CSS string: its quotes and backslashes escaped
    node.style.setProperty(
      '--jp-gpushare-kernel-note',
      `"${` · ${note}`.replace(/["\\]/g, c => `\\${c}`)}"`
    );
  } else if (node.dataset.gpushareNote !== undefined) {
    delete node.dataset.gpushareNote;
    node.style.removeProperty('--jp-gpushare-kernel-note');
  }
}

/** The status bar's tooltip: the notebook, the server's label and sentence. */
export function statusTitle(kernel: IKernel | undefined): string {
  if (!kernel) {
    return say('ui.status.none');
  }
  const s = statusOf(kernel);
  return say('ui.status.title', {
    who: basename(kernel.path) || kernel.kernel_name,
    label: s.label,
    card: kernel.card ? cardLabel(kernel.card) : null,
    detail: s.detail
  });
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

/** A notification's text: the notebook, then what happened, short enough to be read whole. */
export function eventText(e: IEvent, name: string | null): string {
  return say('ui.notify.kernel', {
    name: name ?? say('ui.notify.someone'),
    text: say(`event.${e.code ?? e.kind}`, { message: e.message, ...e.params })
  });
}
