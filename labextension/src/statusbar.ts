import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { GpuShareModel } from './model';
import {
  kernelNote,
  setKernelNote,
  statusOf,
  statusText,
  statusTitle
} from './state';
import { KernelTracker } from './tracker';

/**
 * "GPU 1.2 / 4.6 GiB" for the notebook in front (use against its reservation, as the server judges it), its
 * colour the server's severity, its tooltip the server's sentence; click to open the panel.
 */
export class GpuStatusItem extends Widget {
  constructor(
    readonly model: GpuShareModel,
    readonly tracker: KernelTracker,
    onClick: () => void
  ) {
    super({ node: document.createElement('div') });
    this.addClass('jp-gpushare-status');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        onClick();
      }
    });
    model.changed.connect(this.update, this);
    tracker.changed.connect(this.update, this);
    this.update();
  }

  /** Whether the status bar shows the item at all. */
  get available(): boolean {
    const m = this.model;
    return (
      m.settings.showStatusBar &&
      this.tracker.current.hasSession &&
      (m.snapshot.error?.kind ?? '') !== 'missing'
    );
  }

  update(): void {
    const k = this.tracker.currentKernel;
    const text = statusText(k, {
      backend: this.model.snapshot.state?.backend,
      hasKernel: !!this.tracker.current.kernelId
    });
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.title = statusTitle(k);
    this.node.setAttribute(
      'aria-label',
      `${this.node.title} Show GPU memory quotas.`
    );
    this.node.dataset.severity = k ? statusOf(k).severity : 'muted';
    this.node.dataset.state = k ? String(k.state) : 'none';
    const note = kernelNote(k);
    if (note) {
      this._markKernelStatus();
    }
    setKernelNote(document.body, note);
  }

  /**
   * JupyterLab renders its own kernel status again, into a new element at times, when the kernel's status changes
   * (it may not be there yet when ours changes, and React renders after its signals): mark it whenever the status
   * bar's content changes while a note is shown, not only at our next change.
   */
  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    const bar = this.node.closest('.jp-StatusBar-Widget');
    if (bar) {
      this._watch.observe(bar, {
        childList: true,
        subtree: true,
        characterData: true
      });
    }
  }

  protected onBeforeDetach(msg: Message): void {
    this._watch.disconnect();
    super.onBeforeDetach(msg);
  }

  private _watch = new MutationObserver(() => {
    if (document.body.dataset.gpushareNote !== undefined) {
      this._markKernelStatus();
    }
  });

  /**
   * Find JupyterLab's own kernel status in the status bar ("Python 3 (ipykernel) | Idle": it has no id or class of
   * its own) by the kernel's name, and mark it for the note (style/base.css). React keeps the element it renders into.
   */
  private _markKernelStatus(): void {
    const name = this.tracker.widget?.sessionContext.kernelDisplayName;
    const bar = this.node.closest('.jp-StatusBar-Widget') ?? document;
    if (!name || bar.querySelector('[data-gpushare-kernel-status]')) {
      return;
    }
    for (const item of Array.from(
      bar.querySelectorAll<HTMLElement>('.jp-StatusBar-TextItem')
    )) {
      const text = item.textContent ?? '';
      if (text === name || text.startsWith(`${name} | `)) {
        item.dataset.gpushareKernelStatus = '';
        return;
      }
    }
  }
}
