import { Widget } from '@lumino/widgets';

import { GpuShareModel } from './model';
import { quotaMiB, statusText, statusTitle } from './state';
import { isMeasured } from './format';

/** "GPU 1.2 / 4.0 GiB" for the notebook in front; click to open the panel. */
export class GpuStatusItem extends Widget {
  constructor(
    readonly model: GpuShareModel,
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
    this.update();
  }

  /** Whether the status bar shows the item at all. */
  get available(): boolean {
    const m = this.model;
    return (
      m.settings.showStatusBar &&
      m.current.hasSession &&
      (m.snapshot.error?.kind ?? '') !== 'missing'
    );
  }

  update(): void {
    const m = this.model;
    const k = m.currentKernel;
    const text = statusText(k, {
      backend: m.snapshot.cards?.backend,
      hasKernel: !!m.current.kernelId
    });
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.title = statusTitle(k);
    const q = k ? quotaMiB(k) : null;
    const level =
      k && isMeasured(k.used_mib) && q
        ? k.used_mib > q
          ? 'over'
          : k.used_mib >= (q * m.settings.nearQuotaPercent) / 100
            ? 'near'
            : 'ok'
        : k?.state === 'queued'
          ? 'queued'
          : k?.state === 'cpu'
            ? 'cpu'
            : 'ok';
    this.node.dataset.level = level;
  }
}
