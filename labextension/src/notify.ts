import { Notification } from '@jupyterlab/apputils';

import { basename } from './format';
import { eventText } from './state';
import type { IEvent } from './types';

/**
 * Announce new events, each once, naming the notebook (never a kernel id); a
 * notification about a kernel is closed when that kernel goes away.
 */
export class Notifier {
  constructor(readonly nameOf: (kernelId: string) => string | null) {}

  show(events: IEvent[]): number {
    let shown = 0;
    for (const e of events) {
      const type = e.severity; // the server says how an event is announced
      if (!type) {
        continue;
      }
      // the notebook's name now (it follows renames), or the one the event was said for
      const name =
        (e.kernel_id ? this.nameOf(e.kernel_id) : null) ??
        (e.path ? basename(e.path) : null);
      const id = Notification.emit(eventText(e, name), type, {
        autoClose: type === 'error' ? false : 8000
      });
      if (e.kernel_id && e.kind !== 'refused' && e.kind !== 'cancelled') {
        // (what ended a kernel stays until read: the kernel is gone by then)
        const ids = this._byKernel.get(e.kernel_id) ?? [];
        ids.push(id);
        this._byKernel.set(e.kernel_id, ids);
      }
      shown++;
    }
    return shown;
  }

  /** Close what was said about kernels that are gone. */
  forget(present: Set<string>): void {
    for (const [kernelId, ids] of this._byKernel) {
      if (!present.has(kernelId)) {
        ids.forEach(id => Notification.dismiss(id));
        this._byKernel.delete(kernelId);
      }
    }
  }

  private _byKernel = new Map<string, string[]>();
}
