import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { EventCursor, ReplyGuard } from './guard';
import { GpuShareError, requestAPI } from './request';
import { findKernel } from './state';
import type {
  ICardsReply,
  IConfig,
  IEvent,
  IHostView,
  IKernel,
  IQueueEntry
} from './types';

/** What the user chose in the settings (schema/plugin.json). */
export interface ISettings {
  refreshInterval: number;
  showStatusBar: boolean;
  showCards: boolean;
  showFrameworks: boolean;
  notifications: boolean;
  nearQuotaPercent: number;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshInterval: 3000,
  showStatusBar: true,
  showCards: true,
  showFrameworks: true,
  notifications: true,
  nearQuotaPercent: 90
};

/** Why there is nothing to show. */
export type ErrorKind = 'missing' | 'forbidden' | 'unreachable' | 'server';

export interface IModelError {
  kind: ErrorKind;
  message: string;
}

/** The notebook (or console) in front: its kernel id once known, and its path. */
export interface ICurrent {
  kernelId: string | null;
  path: string | null;
  /** The widget has a session context (it can run a kernel). */
  hasSession: boolean;
}

/** Everything the panel and the status bar show; replaced as a whole on each refresh. */
export interface ISnapshot {
  cards: ICardsReply | null;
  kernels: IKernel[];
  queue: IQueueEntry[];
  config: IConfig | null;
  error: IModelError | null;
  /** Client time of the last good refresh (ms). */
  updated: number | null;
  /** GET /host, read only while the "This host" section is open and the panel shown. */
  host: IHostView | null;
  /** Why /host could not be read (e.g. 503: the broker is down); the rest is unaffected. */
  hostError: IModelError | null;
}

/** An error of the API for people: what kind, and the server's message. */
function modelError(error: unknown): IModelError {
  const e = error as GpuShareError;
  const kind: ErrorKind =
    e.status === 404
      ? 'missing'
      : e.status === 403
        ? 'forbidden'
        : e.status === null
          ? 'unreachable'
          : 'server';
  return { kind, message: e.message ?? String(e) };
}

/**
 * Polls /api/gpushare/ and holds the latest snapshot. One poll serves the panel,
 * the status bar and the notifications.
 */
export class GpuShareModel {
  constructor(serverSettings: ServerConnection.ISettings) {
    this.serverSettings = serverSettings;
    this._poll = new Poll({
      factory: () => this._refresh(),
      frequency: {
        interval: this._settings.refreshInterval,
        backoff: true,
        max: 60 * 1000
      },
      name: 'jupyter-gpushare:refresh',
      standby: 'when-hidden'
    });
  }

  readonly serverSettings: ServerConnection.ISettings;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** New events since the page loaded (each once). */
  get events(): ISignal<this, IEvent[]> {
    return this._events;
  }

  get snapshot(): ISnapshot {
    return this._snapshot;
  }

  get settings(): ISettings {
    return this._settings;
  }

  set settings(value: ISettings) {
    const old = this._settings;
    this._settings = { ...DEFAULT_SETTINGS, ...value };
    if (old.refreshInterval !== this._settings.refreshInterval) {
      this._poll.frequency = {
        ...this._poll.frequency,
        interval: this._settings.refreshInterval
      };
      void this._poll.refresh();
    }
    this._changed.emit();
  }

  get current(): ICurrent {
    return this._current;
  }

  /** The current notebook changed (or its kernel did). */
  setCurrent(current: ICurrent): void {
    const same =
      current.kernelId === this._current.kernelId &&
      current.path === this._current.path &&
      current.hasSession === this._current.hasSession;
    this._current = current;
    this._guard.setCurrent(current.kernelId);
    if (!same) {
      this._changed.emit();
      void this.refreshCurrent();
    }
  }

  /** The current notebook's kernel record, if the server has one. */
  get currentKernel(): IKernel | undefined {
    return findKernel(
      this._snapshot.kernels,
      this._current.kernelId,
      this._current.path
    );
  }

  /**
   * Ask for the current kernel alone (quick update after a switch). A reply
   * that comes after the user moved to another kernel is dropped.
   */
  async refreshCurrent(): Promise<void> {
    const id = this._current.kernelId;
    if (!id || this._snapshot.error) {
      return;
    }
    const ticket = this._guard.ticket();
    let kernel: IKernel | null = null;
    try {
      kernel = await requestAPI<IKernel>(
        `kernels/${encodeURIComponent(id)}`,
        this.serverSettings
      );
    } catch {
      return; // not (yet) known to the server: the poll will tell
    }
    if (!this._guard.accept(ticket) || !kernel) {
      this.droppedReplies++;
      return;
    }
    const kernels = this._snapshot.kernels.filter(
      k => k.kernel_id !== kernel!.kernel_id
    );
    kernels.push(kernel);
    this._update({ ...this._snapshot, kernels });
  }

  /** Refresh now (after an action). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** Ask for another quota (applies at the next restart). */
  async requestQuota(kernelId: string, quota: string): Promise<IKernel> {
    const k = await requestAPI<IKernel>(
      `kernels/${encodeURIComponent(kernelId)}`,
      this.serverSettings,
      { method: 'PATCH', body: JSON.stringify({ quota }) }
    );
    void this.refresh();
    return k;
  }

  /** Stop a queued kernel's wait; its start request then fails with the server's message. */
  async stopWaiting(kernelId: string): Promise<void> {
    await requestAPI<IKernel>(
      `kernels/${encodeURIComponent(kernelId)}`,
      this.serverSettings,
      { method: 'DELETE' }
    );
    void this.refresh();
  }

  /** Replies dropped because their kernel was no longer current (for tests). */
  droppedReplies = 0;

  /** The "This host" section is open: /host is read with each refresh. */
  get hostOpen(): boolean {
    return this._hostOpen;
  }

  set hostOpen(value: boolean) {
    if (value === this._hostOpen) {
      return;
    }
    this._hostOpen = value;
    this._watchHost();
    this._changed.emit();
  }

  /** The panel is on screen (the host view is read only then). */
  setPanelVisible(visible: boolean): void {
    if (visible !== this._panelVisible) {
      this._panelVisible = visible;
      this._watchHost();
    }
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  /** Start or stop reading /host; a reply that comes after a change is dropped. */
  private _watchHost(): void {
    const watched = this._hostOpen && this._panelVisible;
    this._hostGuard.setCurrent(watched ? 'host' : null);
    if (watched) {
      void this._refreshHost();
    } else if (this._snapshot.host || this._snapshot.hostError) {
      // Not read while closed: show no stale figures when it opens again.
      this._update({ ...this._snapshot, host: null, hostError: null });
    }
  }

  /** Read /host (never rejects: its errors stay in its section). */
  private async _refreshHost(): Promise<void> {
    if (this._hostGuard.current === null) {
      return;
    }
    const ticket = this._hostGuard.ticket();
    let host: IHostView | null = null;
    let hostError: IModelError | null = null;
    try {
      host = await requestAPI<IHostView>('host', this.serverSettings);
    } catch (error) {
      hostError = modelError(error);
    }
    if (!this._hostGuard.accept(ticket)) {
      return; // closed (or reopened) meanwhile, or a newer reply came first
    }
    this._update({ ...this._snapshot, host, hostError });
  }

  private async _refresh(): Promise<void> {
    const s = this.serverSettings;
    // The host view is read alongside, only while watched. It never rejects, so its errors
    // (e.g. 503 while the broker is down) neither fail this refresh nor back the poll off;
    // the next tick waits for it, so slow replies do not pile up.
    const host = this._refreshHost();
    try {
      const first = this._snapshot.config === null;
      const [cards, kernels, queue, config, events] = await Promise.all([
        requestAPI<ICardsReply>('cards', s),
        requestAPI<{ kernels: IKernel[] }>('kernels', s),
        requestAPI<{ queue: IQueueEntry[] }>('queue', s),
        first || this._tick % 20 === 0
          ? requestAPI<IConfig>('config', s)
          : Promise.resolve(this._snapshot.config),
        requestAPI<{ events: IEvent[] }>(
          `events?since=${this._cursor.since}`,
          s
        )
      ]);
      this._tick++;
      this._update({
        ...this._snapshot,
        cards,
        kernels: kernels.kernels ?? [],
        queue: queue.queue ?? [],
        config,
        error: null,
        updated: Date.now()
      });
      const fresh = this._cursor.take(events.events ?? []);
      if (fresh.length) {
        this._events.emit(fresh);
      }
    } catch (error) {
      this._update({ ...this._snapshot, error: modelError(error) });
      throw error; // the poll backs off
    }
    await host;
  }

  private _update(next: ISnapshot): void {
    const key = JSON.stringify([
      next.cards,
      next.kernels,
      next.queue,
      next.config,
      next.error,
      next.host,
      next.hostError
    ]);
    this._snapshot = next;
    if (key !== this._lastKey) {
      this._lastKey = key;
      this._changed.emit();
    }
  }

  private _poll: Poll;
  private _tick = 0;
  private _lastKey = '';
  private _settings: ISettings = { ...DEFAULT_SETTINGS };
  private _snapshot: ISnapshot = {
    cards: null,
    kernels: [],
    queue: [],
    config: null,
    error: null,
    updated: null,
    host: null,
    hostError: null
  };
  private _current: ICurrent = {
    kernelId: null,
    path: null,
    hasSession: false
  };
  private _guard = new ReplyGuard<string>();
  private _hostGuard = new ReplyGuard<string>();
  private _hostOpen = false;
  private _panelVisible = false;
  private _cursor = new EventCursor();
  private _changed = new Signal<this, void>(this);
  private _events = new Signal<this, IEvent[]>(this);
}
