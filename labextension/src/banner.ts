import { NotebookPanel } from '@jupyterlab/notebook';
import { MessageLoop, Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IKernelActions } from './actions';
import { GpuShareModel } from './model';
import {
  kernelNote,
  setKernelNote,
  statusOf,
  statusText,
  statusTitle
} from './state';
import { KernelTracker } from './tracker';
import type { IKernel } from './types';
import { say } from './words';

/**
 * In a notebook whose kernel waits for a GPU: a banner above its cells that says
 * so, with its place in line, what it needs and when the wait gives up, and a
 * button to stop waiting. The kernel runs from the start: CPU cells run, and a
 * cell that uses the GPU waits in the kernel until the grant. When a wait ends
 * without a GPU (stopped, or past the line's timeout) the banner stays, with the
 * reason and *Join again*, until the kernel restarts or the notebook closes.
 */
export class QueuedBanner extends Widget {
  private _expanded = false; // the whole sentence shown in a narrow column

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
    this._update();
  }

  dispose(): void {
    this.model.setWatching(this.panel.id, false);
    super.dispose();
  }

  private _update(): void {
    const k = this.tracker.kernelOf(this.panel);
    const queued = k?.state === 'queued';
    this.model.setWatching(this.panel.id, queued);
    setKernelNote(this.panel.node, kernelNote(k));
    if (!k || !(queued || (k.state === 'cpu' && k.wait_ended))) {
      this.hide();
      return;
    }
    this._render(k);
    this.show();
    this._fit();
  }

  private readonly _button = document.createElement('button');

  private _render(k: IKernel): void {
    // the same sentence as the panel's and the status bar's tooltip: the server's judgment, worded once
    const status = statusOf(k);
    const text = document.createElement('span');
    text.className = 'jp-gpushare-banner-text';
    text.textContent = status.detail;
    // In a narrow column the sentence shows three lines: a click, or Enter, shows the rest (and hides it again)
    text.tabIndex = 0;
    text.title = status.detail;
    text.classList.toggle('jp-mod-expanded', this._expanded);
    text.setAttribute('aria-expanded', String(this._expanded));
    const toggle = () => {
      this._expanded = !this._expanded;
      text.classList.toggle('jp-mod-expanded', this._expanded);
      text.setAttribute('aria-expanded', String(this._expanded));
      this._fit();
    };
    text.onclick = toggle;
    text.onkeydown = e => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        toggle();
      }
    };
    this.node.dataset.severity = status.severity;
    const name = this.actions.nameOf(k);
    // the same button element across renders: a re-render while it has the focus, or while a dialog it opened is
    // up (the dialog gives the focus back to it), keeps the focus where the student left it
    const button = this._button;
    if (k.state === 'queued') {
      button.className =
        'jp-Button jp-mod-styled jp-mod-reject jp-gpushare-banner-stop';
      button.textContent = say('ui.stop.button');
      button.setAttribute('aria-label', say('ui.stop.label', { name }));
      button.onclick = () => void this.actions.stopWaiting(k);
    } else {
      button.className =
        'jp-Button jp-mod-styled jp-mod-accept jp-gpushare-banner-join';
      button.textContent = say('ui.join.button');
      button.setAttribute('aria-label', say('ui.join.label', { name }));
      button.onclick = () => void this.actions.joinAgain(k);
    }
    const old = this.node.querySelector('.jp-gpushare-banner-text');
    if (old) {
      old.replaceWith(text);
    } else {
      this.node.prepend(text);
    }
    if (button.parentNode !== this.node) {
      this.node.append(button);
    }
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
   * min-height: give it the banner's content height, which changes with its width
   * (its text and button wrap onto lines of their own in a narrow column).
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
    // from the highest child's top to the lowest one's bottom, wherever the flex box centres them
    const boxes = Array.from(this.node.children, c =>
      c.getBoundingClientRect()
    );
    const inner = boxes.length
      ? Math.max(...boxes.map(b => b.bottom)) -
        Math.min(...boxes.map(b => b.top))
      : 0;
    const want = `${Math.ceil(inner + frame)}px`;
    if (this.node.style.minHeight !== want) {
      this.node.style.minHeight = want;
      if (this.parent) {
        MessageLoop.postMessage(this.parent, Widget.Msg.FitRequest);
      }
    }
  }
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
    this.node.dataset.severity = k ? statusOf(k).severity : 'muted';
  }
}
