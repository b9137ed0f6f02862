import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { EventCursor, ReplyGuard } from './guard';
import { GpuShareError, requestAPI, requestState } from './request';
import type { HostAction, IEvent, IHostView, IKernel, IState } from './types';

/** What the user chose in the settings (schema/plugin.json). */
export interface ISettings {
  refreshInterval: number;
  showStatusBar: boolean;
  showCards: boolean;
  showFrameworks: boolean;
  notifications: boolean;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshInterval: 3000,
  showStatusBar: true,
  showCards: true,
  showFrameworks: true,
  notifications: true
};

/** How often the state is read while nothing on screen needs it fast (changes are pushed anyway). */
export const SLOW_INTERVAL_MS = 30 * 1000;

/** The server's event bus announces a state change with this schema (state.py, STATE_SCHEMA). */
export const STATE_SCHEMA =
  'https://jupyter-gpushare.org/events/state-changed/v1';

/** Why there is nothing to show. */
export type ErrorKind = 'missing' | 'forbidden' | 'unreachable' | 'server';

export interface IModelError {
  kind: ErrorKind;
  message: string;
}

/** Everything the panel, the status bar, the banner and the notifications show. */
export interface ISnapshot {
  /** GET /api/gpushare/state: the server's judgment of every kernel and card (null before the first reply). */
  state: IState | null;
  error: IModelError | null;
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

/** Something that receives the server's events (JupyterLab's serviceManager.events). */
export interface IEventStream {
  stream: ISignal<any, { schema_id?: string; [key: string]: unknown }>;
}

/**
 * The server's state, read as one versioned reply (GET /api/gpushare/state with If-None-Match: an unchanged
 * state costs a 304) and re-read at once when the server announces a change on its event bus. Between
 * announcements it is polled: fast (the refresh interval) only while something on screen needs live figures
 * (the open panel, a kernel of this user waiting for a GPU), else every 30 s; never while the page is hidden.
 */
export class GpuShareModel {
  constructor(
    serverSettings: ServerConnection.ISettings,
    events?: IEventStream | null
  ) {
    this.serverSettings = serverSettings;
    this._poll = new Poll({
      factory: () => this._refresh(),
      frequency: { interval: SLOW_INTERVAL_MS, backoff: true, max: 60 * 1000 },
      name: 'jupyter-gpushare:state',
      standby: 'when-hidden'
    });
    this._pushed = !!events;
    events?.stream.connect((_, event) => {
      if (event?.schema_id === STATE_SCHEMA) {
        this.announcements++;
        void this._poll.refresh();
      }
    }, this);
  }

  readonly serverSettings: ServerConnection.ISettings;

  /** State changes announced by the server (for tests). */
  announcements = 0;

  /** Requests made for the state (for tests: an idle tab makes few). */
  requests = 0;

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

  /** This server's kernels as the server judges them. */
  get kernels(): IKernel[] {
    return this._snapshot.state?.kernels ?? [];
  }

  kernel(kernelId: string | null | undefined): IKernel | undefined {
    return kernelId
      ? this.kernels.find(k => k.kernel_id === kernelId)
      : undefined;
  }

  get settings(): ISettings {
    return this._settings;
  }

  set settings(value: ISettings) {
    this._settings = { ...DEFAULT_SETTINGS, ...value };
    this._pace();
    this._changed.emit();
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

  /** Stop a kernel's wait for a GPU: it leaves the line and runs on without a GPU (the server says why). */
  async stopWaiting(kernelId: string): Promise<void> {
    await requestAPI<unknown>(
      `kernels/${encodeURIComponent(kernelId)}`,
      this.serverSettings,
      { method: 'DELETE' }
    );
    void this.refresh();
  }

  /**
   * A kernel whose wait ended without a GPU joins the line again in place, its variables kept; a GpuShareError
   * with the server's code where it cannot (join-needs-restart, join-cannot: only a restart gives it a GPU).
   */
  async joinAgain(kernelId: string): Promise<void> {
    await requestAPI<unknown>(
      `kernels/${encodeURIComponent(kernelId)}/join`,
      this.serverSettings,
      { method: 'POST', body: '{}' }
    );
    void this.refresh();
  }

  /** A teacher's action on a kernel of the host (admins only; POST host/kernels/<id>). */
  async actOnHost(
    kernelId: string,
    action: HostAction,
    why: string
  ): Promise<void> {
    await requestAPI<unknown>(
      `host/kernels/${encodeURIComponent(kernelId)}`,
      this.serverSettings,
      { method: 'POST', body: JSON.stringify({ action, why }) }
    );
    void this.refresh();
  }

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

  /** The panel is on screen: figures are read fast, and the host view too when open. */
  setPanelVisible(visible: boolean): void {
    if (visible !== this._panelVisible) {
      this._panelVisible = visible;
      this._watchHost();
      this._pace();
      if (visible) {
        void this.refresh();
      }
    }
  }

  /** Something else on screen needs live figures for a while (e.g. the queued banner). */
  setWatching(who: string, watching: boolean): void {
    if (watching) {
      this._watchers.add(who);
    } else {
      this._watchers.delete(who);
    }
    this._pace();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  /**
   * Fast while the panel is shown (live figures of use, which no event announces). A kernel of this user that
   * waits or starts, and a waiting notebook's banner, need no poll where the server announces its changes on
   * the event bus (a place, a grant, a wait's end): the page then costs what JupyterLab costs (a read every
   * 30 s, for the estimates); without the bus they are polled fast.
   */
  private _pace(): void {
    const waiting = this.kernels.some(
      k => k.state === 'queued' || k.state === 'starting'
    );
    // (a kernel starting: fast for its few seconds, as a change made before the page's event socket connected
    // would otherwise wait for the next slow read)
    const starting = this.kernels.some(k => k.state === 'starting');
    const fast =
      this._panelVisible ||
      starting ||
      ((this._watchers.size > 0 || waiting) && !this._pushed);
    const interval = fast ? this._settings.refreshInterval : SLOW_INTERVAL_MS;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { ...this._poll.frequency, interval };
    }
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
    const host = this._refreshHost(); // never rejects; the next tick waits for it
    try {
      this.requests++;
      const state = await requestState(
        this.serverSettings,
        this._snapshot.state
      );
      this._update({
        ...this._snapshot,
        state,
        error: null
      });
      const fresh = this._cursor.take(state.events ?? []);
      if (fresh.length) {
        this._events.emit(fresh);
      }
    } catch (error) {
      this._update({ ...this._snapshot, error: modelError(error) });
      throw error; // the poll backs off
    } finally {
      this._pace();
    }
    await host;
  }

  private _update(next: ISnapshot): void {
    const changed =
      next.state?.version !== this._snapshot.state?.version ||
      next.error?.message !== this._snapshot.error?.message ||
      next.host !== this._snapshot.host ||
      next.hostError !== this._snapshot.hostError;
    this._snapshot = next;
    if (changed) {
      this._changed.emit();
    }
  }

  private _poll: Poll;
  /** The server's changes reach this page on the event bus. */
  private _pushed = false;
  private _settings: ISettings = { ...DEFAULT_SETTINGS };
  private _snapshot: ISnapshot = {
    state: null,
    error: null,
    host: null,
    hostError: null
  };
  private _hostGuard = new ReplyGuard<string>();
  private _hostOpen = false;
  private _panelVisible = false;
  private _watchers = new Set<string>();
  private _cursor = new EventCursor();
  private _changed = new Signal<this, void>(this);
  private _events = new Signal<this, IEvent[]>(this);
}
