/**
 * The words of the sidebar, worded once: every sentence the server judges is a
 * code with figures (jupyter_gpushare/words.py, whose English catalogue this one
 * must match: tests/test_contract.py checks it), worded here through
 * JupyterLab's translator, so a translation changes the panel, the banner, the
 * status bar and the notifications at once.
 *
 * A template names its figures in braces; a part in square brackets is said only
 * when every figure in it is known. Figures named `*_mib` are sizes, `*_s`
 * times. No JupyterLab import at run time: the node tests use it as is.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

type Bundle = Pick<TranslationBundle, '__'>;

const ENGLISH: Bundle = { __: (msgid: string) => msgid };

/** The catalogue, each entry through the translator (literal msgids, for extraction). */
function catalogue(trans: Bundle): { [code: string]: string } {
  const __ = (msgid: string) => trans.__(msgid);
  return {
    'status.queued.label': __('#{position} in line'),
    'status.queued.detail': __(
      'Waiting for a GPU: #{position} in line, needs {need_mib}[; {free_mib} unreserved now][; about {wait_left_s} at most]. It starts by itself when a kernel frees room; cells you run now run then.'
    ),
    'status.over_quota.label': __('over quota'),
    'status.over_quota.detail': __(
      'Uses {used_mib}: more than its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context). Free memory (del large arrays, or restart) or ask for a larger quota.'
    ),
    'status.near_quota.label': __('near quota'),
    'status.near_quota.detail': __(
      'Uses {used_mib} of its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context)[ ({share_pct}%)]: the next large allocation may fail. Free memory or ask for a larger quota.'
    ),
    'status.idle.label': __('idle'),
    'status.idle.detail': __(
      'Holds {reserved_mib} of GPU memory without using the GPU. Shut it down to give the memory back to others.'
    ),
    'status.running.label': __('running'),
    'status.running.detail': __(
      'Uses {used_mib} of its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context).'
    ),
    'status.running_unmeasured.label': __('running'),
    'status.running_unmeasured.detail': __(
      'Holds its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context); use not measured yet.'
    ),
    'status.starting.label': __('starting'),
    'status.starting.detail': __('Reserving GPU memory for this kernel…'),
    'status.cpu.label': __('no GPU'),
    'status.cpu.detail': __('Started without a GPU.[ {reason}]'),
    'status.none.label': __('no GPU'),
    'status.none.detail': __(
      'This kind of kernel reserves no GPU memory, so it sees no GPU.[ {reason}]'
    ),
    'status.failed.label': __('not running'),
    'status.failed.detail': __('The kernel could not start again.[ {reason}]'),
    'event.queued': __(
      'Waiting for a GPU: #{position} in line, needs {need_mib}.'
    ),
    'event.admitted': __('GPU ready after waiting {waited_s}.'),
    'event.cancelled': __('Stopped waiting for a GPU.'),
    'event.refused': __('Not started: {message}'),
    'event.near-quota': __(
      'Uses {used_mib} of its {reserved_mib} reservation ({share_pct}%): free memory or ask for a larger quota.'
    ),
    'event.over-quota': __(
      'Uses {used_mib}, more than its {reserved_mib} reservation: free memory or ask for a larger quota.'
    ),
    'event.idle': __(
      'Holds {reserved_mib} of GPU memory unused for {idle_s}: shut it down when you are done.'
    ),
    'event.out-of-memory': __(
      '{framework} ran out of GPU memory at quota {quota_mib}: restart with {retry_mib} to run it with more.'
    ),
    'event.quota-requested': __(
      'Quota {quota} requested; it applies at the next restart.'
    ),
    'event.over-quota-notify': __(
      'Still over its {reserved_mib} reservation after {over_s}: free memory or ask for a larger quota.'
    ),
    'event.over-quota-interrupt': __(
      'Interrupted: it used {used_mib}, more than its {reserved_mib} reservation, for {over_s}. Free memory or ask for a larger quota.'
    ),
    'event.over-quota-restart': __(
      'Restarted: it used {used_mib}, more than its {reserved_mib} reservation, for {over_s}. Ask for a larger quota before you run it again.'
    ),
    'event.over-quota-shutdown': __(
      'Shut down: it used {used_mib}, more than its {reserved_mib} reservation, for {over_s}.'
    ),
    'event.idle-shutdown': __(
      'Shut down after {idle_s} without using the GPU; its {reserved_mib} went back to the others.'
    ),
    'event.group-ended': __(
      '{processes} process(es) it had started were still running and were ended with it.'
    ),
    'bar.usage': __('GPU {usage}'),
    'bar.label': __('GPU {label}'),
    'bar.no_gpu': __('no GPU'),
    'bar.no_kernel': __('GPU: no kernel'),
    'bar.unknown': __('GPU –'),
    'notify.kernel': __('{name}: {text}'),
    'notify.someone': __('A kernel'),
    'banner.stop': __('Stop waiting'),
    'banner.stop_label': __('Stop waiting for a GPU for {name}'),
    'config.rules': __(
      'Default quota {default}[, at most {max}][; each kernel also reserves {reserve_mib} for its CUDA context].'
    ),
    'config.queue': __('When the GPU is full, kernels wait in line.'),
    'config.cpu': __('When the GPU is full, kernels start on the CPU.'),
    'config.reject': __('When the GPU is full, kernels are refused.'),
    'limits.use': __('You hold {held}.'),
    'limits.total': __('{quota_mib} of {max_total_mib}'),
    'limits.kernels': __('{kernels} of {max_kernels} GPU kernels'),
    'limits.and': __('{a} and {b}'),
    'quota.restarting': __('Restarting {name} with a {quota} GPU quota…'),
    'size.share': __('{percent}% of a card'),
    'size.pair_mib': __('{used} / {total} MiB'),
    'size.pair_gib': __('{used} / {total} GiB'),
    'size.mib': __('{n} MiB'),
    'size.gib': __('{n} GiB'),
    'time.s': __('{n} s'),
    'time.min': __('{n} min'),
    'time.h': __('{n} h'),
    'time.h_min': __('{h} h {min} min')
  };
}

let words = catalogue(ENGLISH);

/** Word everything with this translator from now on (the plugin sets JupyterLab's at activation). */
export function setTranslator(trans: Bundle | null): void {
  words = catalogue(trans ?? ENGLISH);
}

/**
 * The pseudo-locale (localStorage "jupyter-gpushare:pseudo-locale" = "1", for tests
 * and translators): every translated string marked ⟦…⟧, so that text not worded
 * through the catalogue stands out. Called without a bundle: whether it is on.
 */
export function pseudoLocale(): boolean;
export function pseudoLocale(trans: Bundle): Bundle;
export function pseudoLocale(trans?: Bundle): Bundle | boolean {
  if (!trans) {
    try {
      return (
        typeof window !== 'undefined' &&
        window.localStorage?.getItem(PSEUDO_KEY) === '1'
      );
    } catch {
      return false;
    }
  }
  return { __: (msgid: string) => `⟦${trans.__(msgid)}⟧` };
}

export const PSEUDO_KEY = 'jupyter-gpushare:pseudo-locale';

/** Whether the catalogue has a code. */
export function knows(code: string): boolean {
  return code in words;
}

type Params = { [name: string]: unknown };

function known(value: unknown): boolean {
  return value !== null && value !== undefined && value !== '';
}

function figure(name: string, value: unknown): string {
  if (typeof value === 'number' && name.endsWith('_mib')) {
    return formatMiB(value);
  }
  if (typeof value === 'number' && name.endsWith('_s')) {
    return formatDuration(value);
  }
  return String(value);
}

const PLACEHOLDER = /\{([a-z_]+)\}/g;

function fill(text: string, params: Params): string | null {
  const names = (text.match(PLACEHOLDER) ?? []).map(m => m.slice(1, -1));
  if (names.some(n => !known(params[n]))) {
    return null;
  }
  return text.replace(PLACEHOLDER, (_, n: string) => figure(n, params[n]));
}

/**
 * A code's words with its figures; an unknown code says its `message`
 * parameter (the server's English), else the code.
 */
export function say(code: string, params: Params = {}): string {
  const template = words[code];
  if (template === undefined) {
    return known(params.message) ? String(params.message) : code;
  }
  const text = template.replace(
    /\[([^[\]]*)\]/g,
    (_, part: string) => fill(part, params) ?? ''
  );
  return fill(text, params) ?? text.replace(PLACEHOLDER, '–');
}

/** True when a figure is a finite number (the sampler's fields may be null or absent). */
export function isMeasured(value: number | null | undefined): value is number {
  return typeof value === 'number' && isFinite(value);
}

/** One decimal place, without a trailing ".0" (the server's format_mib) and never "-0". */
function decimal(x: number): string {
  const s = x.toFixed(1).replace(/\.0$/, '');
  return s === '-0' ? '0' : s;
}

/** A size for people, as the server says it: "512 MiB" below 1 GiB, else "1.5 GiB", "3 GiB"; "–" unknown. */
export function formatMiB(mib: number | null | undefined): string {
  if (!isMeasured(mib)) {
    return '–';
  }
  return Math.abs(mib) < 1024
    ? say('size.mib', { n: Math.round(mib) })
    : say('size.gib', { n: decimal(mib / 1024) });
}

/**
 * "used / total unit" with one unit chosen from the total and one decimal place
 * kept (figures side by side): "1.2 / 4.0 GiB", "– / 4.0 GiB" when use is not
 * measured, "300 / 512 MiB" for small quotas.
 */
export function formatUsage(
  usedMiB: number | null | undefined,
  totalMiB: number | null | undefined
): string {
  if (!isMeasured(totalMiB)) {
    return `${formatMiB(usedMiB)} / –`;
  }
  const gib = totalMiB >= 1024;
  const num = (x: number | null | undefined): string =>
    !isMeasured(x) ? '–' : gib ? (x / 1024).toFixed(1) : String(Math.round(x));
  return say(gib ? 'size.pair_gib' : 'size.pair_mib', {
    used: num(usedMiB),
    total: num(totalMiB)
  });
}

/** A size the admin set: "6 GiB", or "25% of a card" for a share; "" when none. */
export function sizeText(
  size: { mib?: number; percent?: number } | null | undefined
): string {
  if (!size) {
    return '';
  }
  return isMeasured(size.percent)
    ? say('size.share', { percent: size.percent })
    : formatMiB(size.mib);
}

/** Seconds for people, as the server says them: "45 s", "3 min", "2 h 5 min" (rounded down). */
export function formatDuration(seconds: number | null | undefined): string {
  if (!isMeasured(seconds)) {
    return '–';
  }
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return say('time.s', { n: s });
  }
  if (s < 3600) {
    return say('time.min', { n: Math.floor(s / 60) });
  }
  const h = Math.floor(s / 3600);
  const min = Math.floor((s % 3600) / 60);
  return min ? say('time.h_min', { h, min }) : say('time.h', { n: h });
}
