import type { CodeCell } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';
import type { KernelMessage } from '@jupyterlab/services';

import type { GpuShareModel } from './model';
import type { KernelTracker } from './tracker';
import type { IHeldCell } from './types';

/**
 * FNV-1a (32 bits) of a cell's code as UTF-8, in hex: what the kernel says of
 * the cell that waits for its GPU (the bootstrap's ``code_hash``).
 */
export function codeHash(code: string): string {
  let h = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(code)) {
    h = Math.imul(h ^ byte, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

const SHOWN = new Set(['stream', 'display_data', 'execute_result', 'error']);

/**
 * A cell of this notebook waits in its kernel for the GPU, sent by a page that
 * is gone (a reload): this page finds it by its code, shows it running, and
 * shows what it prints once it runs, or the reason it did not (the kernel's
 * outputs reach every page on IOPub; only the page that sent a cell shows
 * them otherwise). A cell this page sent itself is JupyterLab's own.
 */
export class HeldCellFollower {
  constructor(
    readonly panel: NotebookPanel,
    readonly model: GpuShareModel,
    readonly tracker: KernelTracker
  ) {
    model.changed.connect(this._check, this);
    // (the server's word may come before the page's kernel connection, or its cells: looked at again then)
    panel.sessionContext.kernelChanged.connect(this._check, this);
    panel.sessionContext.statusChanged.connect(this._ended, this);
    void panel.context.ready.then(() => this._check());
    panel.disposed.connect(() => this.dispose());
    this._check();
  }

  dispose(): void {
    this.model.changed.disconnect(this._check, this);
    this.panel.sessionContext.kernelChanged.disconnect(this._check, this);
    this.panel.sessionContext.statusChanged.disconnect(this._ended, this);
    this._stop();
  }

  /** The message id of the cell followed now (null: none). */
  get following(): string | null {
    return this._held?.msg_id ?? null;
  }

  private _check(): void {
    const held = this.tracker.kernelOf(this.panel)?.held_cell ?? null;
    const kernel = this.panel.sessionContext.session?.kernel;
    if (!held || !kernel || held.msg_id === this._held?.msg_id) {
      return;
    }
    if (this._seen.has(held.msg_id)) {
      return; // (followed to its end already, or this page sent it)
    }
    const found = this._cellOf(held);
    if (found === null) {
      return; // (the notebook's cells are not there yet, or none has that code: looked at again at the next word)
    }
    this._seen.add(held.msg_id);
    if (found === 'own') {
      return;
    }
    const cell = found;
    this._stop();
    this._held = held;
    this._cell = cell;
    cell.model.outputs.clear();
    cell.setPrompt('*');
    kernel.iopubMessage.connect(this._onIOPub, this);
    this._kernel = kernel;
  }

  /**
   * The notebook's code cell with the held cell's code; 'own' when this page
   * runs it (JupyterLab shows it already); null when there is none.
   */
  private _cellOf(held: IHeldCell): CodeCell | 'own' | null {
    let found: CodeCell | 'own' | null = null;
    for (const widget of this.panel.content.widgets) {
      if (widget.model.type !== 'code') {
        continue;
      }
      const cell = widget as CodeCell;
      if (codeHash(cell.model.sharedModel.getSource()) !== held.hash) {
        continue;
      }
      if (cell.model.executionState === 'running') {
        return 'own';
      }
      found = found ?? cell;
    }
    return found;
  }

  private _onIOPub(_: unknown, msg: KernelMessage.IIOPubMessage): void {
    const cell = this._cell;
    if (!cell || (msg.parent_header as any)?.msg_id !== this._held?.msg_id) {
      return;
    }
    const type = msg.header.msg_type;
    if (SHOWN.has(type)) {
      cell.model.outputs.add({ output_type: type, ...(msg.content as any) });
    } else if (type === 'execute_input') {
      cell.model.executionCount = (msg.content as any).execution_count;
    } else if (
      type === 'status' &&
      (msg.content as any).execution_state === 'idle'
    ) {
      const count = this._held?.count ?? cell.model.executionCount;
      cell.model.executionCount = count ?? null;
      cell.setPrompt(count === null || count === undefined ? ' ' : `${count}`);
      this._stop();
    }
  }

  /** The kernel restarts or dies while a cell is followed: that cell will say nothing more. */
  private _ended(_: unknown, status: string): void {
    if (
      this._cell &&
      ['restarting', 'autorestarting', 'dead'].includes(status)
    ) {
      this._cell.setPrompt(' ');
      this._stop();
    }
  }

  private _stop(): void {
    this._kernel?.iopubMessage.disconnect(this._onIOPub, this);
    this._kernel = null;
    this._held = null;
    this._cell = null;
  }

  private _held: IHeldCell | null = null;
  private _cell: CodeCell | null = null;
  private _kernel: {
    iopubMessage: {
      disconnect: (fn: any, ctx: any) => boolean;
    };
  } | null = null;
  private _seen = new Set<string>();
}
