import { Widget } from '@lumino/widgets';

import { GpuShareModel } from './model';
import { statusOf, statusText, statusTitle } from './state';
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
  }
}
