import { Notification } from '@jupyterlab/apputils';

import { notebookName } from './format';
import { eventText } from './state';
import type { IEvent } from './types';

/** How long a toast stays on screen; it stays listed in JupyterLab's notification center after. */
const SHOWN_MS = 8000;
const ERROR_SHOWN_MS = 20000; // longer, but never for good: a toast over the sidebar hides its buttons

/** An event said while its kernel is in a state: its toast closes once the kernel's state is another. */
const HOLDS: { [kind: string]: string } = {
  queued: 'queued',
  'near-quota': 'near_quota',
  'over-quota': 'over_quota',
  'over-quota-notify': 'over_quota',
  idle: 'idle'
};

interface IShown {
  id: string;
  event: IEvent;
  type: Notification.TypeOptions;
  name: string | null;
}

/** How long an event of a kernel whose notebook is not known yet waits for its name before it is said anyway. */
const NAME_GRACE_MS = 3000;

/**
 * Announce new events, each once, naming the notebook (never a kernel id or the
 * temporary UUID path of a session being opened). A notification follows its
 * notebook's name as JupyterLab renames the session, closes when the state it
 * announced clears, and goes when its kernel goes away.
 *
 * An event of a kernel whose notebook is not known yet (JupyterLab opens a
 * session at a temporary path, then renames it) waits up to NAME_GRACE_MS for
 * the name before it is shown, rather than being shown and renamed at once: a
 * toast updated in the instant it is created keeps its first text.
 */
export class Notifier {
  /**
   * ``nameOf``: the notebook's name as a person reads it, or null while it has
   * none (a session not yet renamed); ``describe``: what to call a kernel
   * without one ("python3 kernel").
   */
  constructor(
    readonly nameOf: (kernelId: string) => string | null,
    readonly describe: (kernelId: string) => string | null
  ) {}

  show(events: IEvent[]): number {
    let shown = 0;
    for (const e of events) {
      if (!e.severity) {
        continue; // the server says how an event is announced
      }
      // the notebook's name now, or the one the event was said for
      const name =
        (e.kernel_id ? this.nameOf(e.kernel_id) : null) ??
        (notebookName(e.path) || null);
      if (name === null && e.kernel_id && this.describe(e.kernel_id) !== null) {
        // a kernel the server lists whose session is not renamed yet (one that is gone is said at once)
        const pending = { event: e, timer: 0 };
        pending.timer = window.setTimeout(() => {
          this._pending.delete(pending);
          this._emit(e, this.describe(e.kernel_id!));
        }, NAME_GRACE_MS);
        this._pending.add(pending);
      } else {
        this._emit(e, name);
      }
      shown++;
    }
    return shown;
  }

  /**
   * After a change: ``present`` maps each kernel the server has to its state's
   * code (status.code). What was said of a kernel that is gone, or of a state it
   * has left, is closed; the rest follows its notebook's name. An event waiting
   * for its notebook's name is said once it has one.
   */
  update(present: Map<string, string | null>): void {
    for (const pending of [...this._pending]) {
      const name = this.nameOf(pending.event.kernel_id!);
      if (name !== null) {
        window.clearTimeout(pending.timer);
        this._pending.delete(pending);
        this._emit(pending.event, name);
      }
    }
    for (const [kernelId, said] of this._byKernel) {
      if (!present.has(kernelId)) {
        said.forEach(s => Notification.dismiss(s.id));
        this._byKernel.delete(kernelId);
        continue;
      }
      const state = present.get(kernelId);
      const kept = said.filter(s => {
        const holds = HOLDS[s.event.kind];
        if (holds && state !== holds) {
          Notification.dismiss(s.id);
          return false;
        }
        return true;
      });
      const name = this.nameOf(kernelId);
      for (const s of kept) {
        if (name && name !== s.name) {
          s.name = name;
          Notification.update({
            id: s.id,
            message: eventText(s.event, name),
            type: s.type,
            autoClose: s.type === 'error' ? ERROR_SHOWN_MS : SHOWN_MS
          });
        }
      }
      this._byKernel.set(kernelId, kept);
    }
  }

  private _emit(e: IEvent, name: string | null): void {
    const type = e.severity!;
    const id = Notification.emit(eventText(e, name), type, {
      autoClose: type === 'error' ? ERROR_SHOWN_MS : SHOWN_MS
    });
    if (e.kernel_id && e.kind !== 'refused' && e.kind !== 'cancelled') {
      // (what ended a kernel is not followed: the kernel is gone by then)
      const said = this._byKernel.get(e.kernel_id) ?? [];
      said.push({ id, event: e, type, name });
      this._byKernel.set(e.kernel_id, said);
    }
  }

  private _byKernel = new Map<string, IShown[]>();
  private _pending = new Set<{ event: IEvent; timer: number }>();
}
