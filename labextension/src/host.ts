/**
 * The host-wide view (GET /api/gpushare/host) for people: card splits, the
 * user's limits and their use, table rows and queue lines. Pure functions (no
 * JupyterLab imports) so that they run under node's test runner.
 *
 * A student's view names no other user (the server leaves them out); these
 * functions never add a name either: another user's queue entry is "another
 * user's kernel", and their reservations are one total per card.
 */
import {
  cardLabel,
  formatDuration,
  formatMiB,
  isMeasured,
  notebookName
} from './format';
import type {
  IHostKernel,
  IHostQueueEntry,
  IHostUser,
  IHostView,
  IUserLimits
} from './types';
import { say } from './words';

/** A size limit for people: "16 GiB", or "25% of a card" for a share. */
function limitSize(text: string): string {
  const t = text.trim();
  return t.endsWith('%')
    ? say('ui.size.share', { percent: t.slice(0, -1) })
    : t;
}

/** True when a limits object sets at least one limit. */
export function hasLimits(limits: IUserLimits | null | undefined): boolean {
  return (
    !!limits &&
    (!!limits.max_total ||
      !!limits.max_kernel ||
      isMeasured(limits.max_kernels))
  );
}

/**
 * The user's limits in one phrase: "up to 16 GiB in total, 8 GiB per kernel,
 * 2 GPU kernels". null when no limit applies.
 */
export function limitsText(
  limits: IUserLimits | null | undefined
): string | null {
  if (!limits || !hasLimits(limits)) {
    return null;
  }
  const parts: string[] = [];
  if (limits.max_total) {
    parts.push(say('ui.limits.total', { size: limitSize(limits.max_total) }));
  }
  if (limits.max_kernel) {
    parts.push(say('ui.limits.kernel', { size: limitSize(limits.max_kernel) }));
  }
  if (isMeasured(limits.max_kernels)) {
    parts.push(say('ui.limits.count', { n: limits.max_kernels }));
  }
  return say('ui.limits.up_to', { parts: parts.join(', ') });
}

export interface ILimitsUse {
  /** "You hold 4 GiB of 16 GiB and 1 of 2 GPU kernels." */
  text: string;
  /** A limit is reached: the next kernel (or a larger quota) will be refused. */
  full: boolean;
}

/**
 * How much of their limits the user holds, as the server judges it
 * (`limits_use`: the sum of their kernels' quotas against max_total, their GPU
 * kernels against max_kernels). null when no total or count limit applies.
 */
export function limitsUse(view: IHostView): ILimitsUse | null {
  const use = view.limits_use;
  if (!use) {
    return null;
  }
  const parts = [
    isMeasured(use.max_total_mib)
      ? say('limits.total', {
          quota_mib: use.quota_mib,
          max_total_mib: use.max_total_mib
        })
      : '',
    isMeasured(use.max_kernels)
      ? say('limits.kernels', {
          kernels: use.kernels,
          max_kernels: use.max_kernels
        })
      : ''
  ].filter(Boolean);
  if (!parts.length) {
    return null;
  }
  const held =
    parts.length === 2
      ? say('limits.and', { a: parts[0], b: parts[1] })
      : parts[0];
  return { text: say('limits.use', { held }), full: use.full };
}

/**
 * The name this page gives a kernel this server runs: its notebook's, with
 * its folder where two share a name (null: another server's kernel).
 */
export type NameOf = (kernelId: string) => string | null;

/**
 * One line of the host queue. Another user's entry says only that it is one;
 * `nameOf` names this server's notebooks.
 */
export function queueEntryText(
  entry: IHostQueueEntry,
  nameOf: NameOf = () => null
): string {
  return say('ui.queue.entry', {
    position: entry.position,
    who: queueWho(entry, nameOf),
    waited_s: entry.waited_s
  });
}

/**
 * Whose kernel a place in line is, as far as this view may say, told apart
 * from the user's other kernels: "your demo.ipynb", "bob’s python3 kernel
 * 1a2b3c4d" (an admin's view: the notebook as this server or, through a broker,
 * its own server names it, else the kernel's id), "another user’s kernel".
 */
export function queueWho(
  entry: IHostQueueEntry,
  nameOf: NameOf = () => null
): string {
  const notebook =
    (entry.kernel_id ? nameOf(entry.kernel_id) : null) ||
    notebookName(entry.notebook); // (another server's: the name its server said)
  const kind = entry.kernel_name
    ? say('ui.queue.kind', { kernel: entry.kernel_name })
    : say('ui.queue.kernel');
  const figures = {
    kind: notebook
      ? notebook
      : entry.kernel_id
        ? say('ui.queue.kind_id', { kind, id: entry.kernel_id.slice(0, 8) })
        : kind,
    quota_mib: entry.need_mib, // what it needs, quota + CUDA context: the banner's figure
    user: entry.user
  };
  return entry.mine
    ? say('ui.queue.yours', figures)
    : entry.user
      ? say('ui.queue.user', figures) // an admin's view
      : say('ui.queue.another');
}

/** Whose a kernel of the admin's table is: "your train.ipynb", "bob’s demo.ipynb". */
export function kernelWho(row: IHostKernelRow): string {
  return row.mine
    ? say('ui.queue.yours', { kind: row.name })
    : say('ui.queue.user', { kind: row.name, user: row.user });
}

export interface IHostKernelRow {
  kernelId: string;
  user: string;
  /** The notebook's name when this server knows the kernel, else "python3 · 1a2b3c4d". */
  name: string;
  /** The card's index (the column is headed "GPU"). */
  card: string;
  quota: string;
  age: string;
  /** Tooltip: kernel id, reservation, processes. */
  title: string;
  mine: boolean;
}

/**
 * Rows of the admin's kernel table, by user then oldest first. `nameOf`
 * names the kernels this server runs (others: null).
 */
export function hostKernelRows(
  view: IHostView,
  nameOf: NameOf = () => null
): IHostKernelRow[] {
  const pid = (p: number | null | undefined) =>
    isMeasured(p) ? String(p) : say('ui.host.pid_hidden');
  return [...view.kernels]
    .sort(
      (a, b) =>
        a.user.localeCompare(b.user) ||
        b.age_s - a.age_s ||
        a.kernel_id.localeCompare(b.kernel_id)
    )
    .map((k: IHostKernel) => {
      const label = cardLabel({ index: k.card_index, label: k.card_label });
      return {
        kernelId: k.kernel_id,
        user: k.user,
        name:
          nameOf(k.kernel_id) ||
          notebookName(k.notebook) ||
          `${k.kernel_name} · ${k.kernel_id.slice(0, 8)}`,
        card: label.replace(/^GPU /, ''), // the column is headed "GPU"
        quota: formatMiB(k.quota_mib),
        age: formatDuration(k.age_s),
        title: say('ui.host.row', {
          kernel_id: k.kernel_id,
          kernel: k.kernel_name,
          card: label,
          quota_mib: k.quota_mib,
          reserve_mib: k.reserve_mib,
          reserved_mib: k.reserved_mib,
          server_pid: pid(k.server_pid),
          kernel_pid: pid(k.kernel_pid)
        }),
        mine: k.user === view.user
      };
    });
}

/** The totals row of the per-user table: kernels and reserved memory of everyone shown. */
export function usersTotal(users: IHostUser[]): {
  kernels: number;
  reserved_mib: number;
} {
  return users.reduce(
    (t, u) => ({
      kernels: t.kernels + u.kernels,
      reserved_mib: t.reserved_mib + u.reserved_mib
    }),
    { kernels: 0, reserved_mib: 0 }
  );
}
