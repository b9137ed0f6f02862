import { Notification } from '@jupyterlab/apputils';
import { Cell, CodeCell } from '@jupyterlab/cells';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { MessageLoop, Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IKernelActions } from './actions';
import { basename, formatDuration, formatMiB, isMeasured } from './format';
import { GpuShareModel } from './model';
import { statusText, statusTitle } from './state';
import { KernelTracker } from './tracker';
import type { IEvent, IKernel } from './types';

/**
 * In a notebook whose kernel waits for a GPU: a banner above its cells that says
 * so, with its place in line, what it needs and how long it may wait at most,
 * and a button to stop waiting. Cells run while it waits are held, marked, and
 * run in order once the kernel is admitted (JupyterLab would otherwise drop
 * them: there is no kernel yet); if the start is refused or stopped, they are
 * unmarked and the notification says they did not run.
 */
export class QueuedBanner extends Widget {
  constructor(
    readonly panel: NotebookPanel,
    readonly model: GpuShareModel,
    readonly tracker: KernelTracker,
    readonly actions: IKernelActions
  ) {
    super();
    this.addClass('jp-gpushare-banner');
    this.node.setAttribute('role', 'status');
    this.hide();
    model.changed.connect(this._update, this);
    panel.sessionContext.kernelChanged.connect(this._update, this);
    panel.sessionContext.statusChanged.connect(this._update, this);
    NotebookActions.executionScheduled.connect(this._onScheduled, this);
    model.events.connect(this._onEvents, this);
    this._update();
  }

  /** The cells run while the kernel waited, in the order they were run. */
  get held(): readonly Cell[] {
    return this._held;
  }

  dispose(): void {
    NotebookActions.executionScheduled.disconnect(this._onScheduled, this);
    this.model.setWatching(this.panel.id, false);
    super.dispose();
  }

  private _kernel(): IKernel | undefined {
    return this.tracker.kernelOf(this.panel);
  }

  private _onScheduled(
    _: unknown,
    args: { notebook: unknown; cell: Cell }
  ): void {
    if (
      args.notebook !== this.panel.content ||
      args.cell.model.type !== 'code'
    ) {
      return;
    }
    const waiting = this._kernel()?.state === 'queued';
    const noKernel = !this.panel.sessionContext.session?.kernel;
    if (waiting && noKernel && !this._held.includes(args.cell)) {
      this._held.push(args.cell);
      args.cell.addClass('jp-gpushare-held');
      args.cell.node.title = 'Runs once this notebook’s kernel gets its GPU';
      this._render(this._kernel()!);
    }
  }

  private _update(): void {
    const k = this._kernel();
    const queued = k?.state === 'queued';
    this.model.setWatching(this.panel.id, queued);
    if (queued) {
      this._wasQueued = k!.kernel_id;
      this._render(k!);
      this.show();
      this._fit();
      return;
    }
    this.hide();
    if (!this._held.length || !this._wasQueued) {
      return;
    }
    const kernel = this.panel.sessionContext.session?.kernel;
    if (
      kernel?.id === this._wasQueued &&
      (k?.state === 'running' ||
        this.panel.sessionContext.kernelDisplayStatus === 'idle')
    ) {
      void this._runHeld();
    }
    // a refused or cancelled start is said by the server's event (see _onEvents);
    // until then the session request may still be on its way back
  }

  private _onEvents(_: unknown, events: IEvent[]): void {
    const ended = events.find(
      e =>
        e.kernel_id === this._wasQueued &&
        (e.kind === 'cancelled' || e.kind === 'refused')
    );
    if (ended && this._held.length) {
      this._drop(
        ended.kind === 'cancelled'
          ? 'You stopped waiting for a GPU'
          : 'Its kernel was not started'
      );
    }
  }

  private async _runHeld(): Promise<void> {
    const cells = this._held.splice(0);
    this._wasQueued = null;
    for (const cell of cells) {
      this._unmark(cell);
    }
    for (const cell of cells) {
      if (!cell.isDisposed) {
        await CodeCell.execute(cell as CodeCell, this.panel.sessionContext);
      }
    }
  }

  private _drop(why: string): void {
    const cells = this._held.splice(0);
    this._wasQueued = null;
    for (const cell of cells) {
      this._unmark(cell);
    }
    Notification.warning(
      `${basename(this.panel.sessionContext.path)}: ${why}, so the ${cells.length} cell${cells.length === 1 ? '' : 's'} run while it waited did not run. Run ${cells.length === 1 ? 'it' : 'them'} again.`,
      { autoClose: false }
    );
  }

  private _unmark(cell: Cell): void {
    cell.removeClass('jp-gpushare-held');
    cell.node.removeAttribute('title');
  }

  private _render(k: IKernel): void {
    const pos = isMeasured(k.position) ? `#${k.position}` : '';
    const need = isMeasured(k.need_mib) ? `needs ${formatMiB(k.need_mib)}` : '';
    const most = isMeasured(k.wait_left_s)
      ? `about ${formatDuration(k.wait_left_s)} at most`
      : '';
    const facts =
      [pos, need].filter(Boolean).join(', ') + (most ? `; ${most}` : '');
    const held = this._held.length
      ? ` ${this._held.length} cell${this._held.length === 1 ? '' : 's'} will run once it is ready.`
      : ' Cells you run now will run once it is ready.';
    this.node.replaceChildren();
    const text = document.createElement('span');
    text.className = 'jp-gpushare-banner-text';
    text.textContent = `Waiting for a GPU${facts ? ` (${facts})` : ''}.${held}`;
    const stop = document.createElement('button');
    stop.className =
      'jp-Button jp-mod-styled jp-mod-reject jp-gpushare-banner-stop';
    stop.textContent = 'Stop waiting';
    stop.setAttribute(
      'aria-label',
      `Stop waiting for a GPU for ${this.actions.nameOf(k)}`
    );
    stop.onclick = () => void this.actions.stopWaiting(k);
    this.node.append(text, stop);
    this.node.title = k.status?.detail ?? '';
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._fit();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._fit();
  }

  /**
   * The notebook's content header (a Lumino BoxPanel) sizes its children by their
   * min-height: give it the banner's text height, which changes with its width.
   */
  private _fit(): void {
    if (!this.isVisible) {
      return;
    }
    const style = getComputedStyle(this.node);
    const frame = [
      'paddingTop',
      'paddingBottom',
      'borderTopWidth',
      'borderBottomWidth'
    ]
      .map(p => parseFloat((style as any)[p]) || 0)
      .reduce((a, b) => a + b, 0);
    const inner = Math.max(
      0,
      ...Array.from(this.node.children, c => (c as HTMLElement).offsetHeight)
    );
    const want = `${Math.ceil(inner + frame)}px`;
    if (this.node.style.minHeight !== want) {
      this.node.style.minHeight = want;
      if (this.parent) {
        MessageLoop.postMessage(this.parent, Widget.Msg.FitRequest);
      }
    }
  }

  private _held: Cell[] = [];
  private _wasQueued: string | null = null;
}

/**
 * An at-a-glance indicator in a notebook's toolbar (Notebook 7 has no status bar): the status bar's text and
 * tooltip for this notebook's kernel.
 */
export class ToolbarIndicator extends Widget {
  constructor(
    readonly panel: NotebookPanel,
    readonly model: GpuShareModel,
    readonly tracker: KernelTracker,
    onClick: () => void
  ) {
    super({ node: document.createElement('button') });
    this.addClass('jp-gpushare-indicator');
    this.node.addEventListener('click', onClick);
    model.changed.connect(this._update, this);
    panel.sessionContext.kernelChanged.connect(this._update, this);
    this._update();
  }

  private _update(): void {
    const k = this.tracker.kernelOf(this.panel);
    const text = statusText(k, {
      backend: this.model.snapshot.state?.backend,
      hasKernel: !!this.panel.sessionContext.session?.kernel
    });
    this.node.textContent = text;
    this.node.title = statusTitle(k);
    this.node.setAttribute('aria-label', `${text}. Show GPU memory quotas`);
    this.node.dataset.severity = k?.status?.severity ?? 'muted';
  }
}
