import { Notification } from '@jupyterlab/apputils';

import { basename } from './format';
import type { IEvent, IKernel } from './types';

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
  if (k === 'refused' || k.includes('over') || k.includes('failed')) {
    return 'error';
  }
  if (k === 'no-gpu' || k.includes('near') || k.includes('idle')) {
    return 'warning';
  }
  if (
    k === 'queued' ||
    k.includes('action') ||
    k.includes('restart') ||
    k.includes('shutdown') ||
    k.includes('shut-down') ||
    k.includes('kill')
  ) {
    return 'warning';
  }
  return null;
}

/** Show each new event once, naming the notebook when the kernel is known. */
export function notifyEvents(
  events: IEvent[],
  kernels: IKernel[],
  pathOf: (kernelId: string) => string | null
): number {
  let shown = 0;
  for (const e of events) {
    const type = classifyEvent(e.kind);
    if (!type) {
      continue;
    }
    const k = e.kernel_id
      ? kernels.find(x => x.kernel_id === e.kernel_id)
      : undefined;
    const path = (e.kernel_id && pathOf(e.kernel_id)) || k?.path || null;
    const who = path ? `${basename(path)}: ` : '';
    const title =
      e.kind === 'admitted'
        ? 'GPU ready. '
        : e.kind === 'refused'
          ? 'Kernel not started. '
          : '';
    Notification.emit(`${who}${title}${e.message}`, type, {
      autoClose: type === 'error' ? false : 8000
    });
    shown++;
  }
  return shown;
}
