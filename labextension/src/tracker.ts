import { ILabShell } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { GpuShareModel } from './model';
import { matchKernel } from './state';
import type { IKernel } from './types';

/** A widget that can run a kernel (notebook, console). */
export type SessionWidget = Widget & { sessionContext: ISessionContext };

export function hasSession(w: Widget | null | undefined): w is SessionWidget {
  return !!w && !!(w as any).sessionContext;
}

/** The notebook (or console) in front: its kernel id once known, and its path. */
export interface ICurrent {
  kernelId: string | null;
  path: string | null;
  /** The widget has a session context (it can run a kernel). */
  hasSession: boolean;
}

/**
 * Which notebook is in front, and which of the server's kernel records is its
 * own: matched by kernel id (its session's), never by file name; the path shown
 * is the server's, which follows renames. A kernel waiting for a GPU has its id
 * from the start, like any other.
 */
export class KernelTracker {
  constructor(
    readonly model: GpuShareModel,
    labShell: ILabShell | null,
    readonly notebooks: INotebookTracker | null
  ) {
    const front = () =>
      (labShell?.currentWidget as Widget | null) ??
      notebooks?.currentWidget ??
      null;
    labShell?.currentChanged.connect((_, args) => this._follow(args.newValue));
    notebooks?.currentChanged.connect((_, w) => this._follow(w));
    this._follow(front());
    this._front = front;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get current(): ICurrent {
    return this._current;
  }

  get widget(): SessionWidget | null {
    return this._widget;
  }

  /** The record of the notebook in front, if the server has one. */
  get currentKernel(): IKernel | undefined {
    return matchKernel(this.model.kernels, this._current.kernelId);
  }

  /** The record of any open notebook's kernel. */
  kernelOf(w: SessionWidget): IKernel | undefined {
    return matchKernel(
      this.model.kernels,
      w.sessionContext.session?.kernel?.id ?? null
    );
  }

  /** The open notebook of a kernel (by its session's kernel id). */
  widgetOf(k: IKernel): SessionWidget | null {
    let found: SessionWidget | null = null;
    this.notebooks?.forEach(w => {
      if (!found && this.kernelOf(w)?.kernel_id === k.kernel_id) {
        found = w;
      }
    });
    return found;
  }

  private _read(): void {
    const ctx = this._widget?.sessionContext;
    const next: ICurrent = {
      kernelId: ctx?.session?.kernel?.id ?? null,
      path: ctx?.path ?? null,
      hasSession: !!ctx
    };
    const c = this._current;
    if (
      next.kernelId !== c.kernelId ||
      next.path !== c.path ||
      next.hasSession !== c.hasSession
    ) {
      this._current = next;
      this._changed.emit();
      void this.model.refresh();
    }
  }

  private _follow(w: Widget | null): void {
    if (w === this._widget || (w && !hasSession(w))) {
      return; // a panel or the file browser in front: keep the last notebook
    }
    const old = this._widget;
    if (old) {
      old.sessionContext.kernelChanged.disconnect(this._read, this);
      old.sessionContext.sessionChanged.disconnect(this._read, this);
      old.sessionContext.propertyChanged.disconnect(this._read, this);
      old.disposed.disconnect(this._onDisposed, this);
    }
    this._widget = (w as SessionWidget | null) ?? null;
    const ctx = this._widget?.sessionContext;
    if (ctx) {
      ctx.kernelChanged.connect(this._read, this);
      ctx.sessionChanged.connect(this._read, this);
      ctx.propertyChanged.connect(this._read, this); // a rename (path)
      this._widget!.disposed.connect(this._onDisposed, this);
    }
    this._read();
  }

  private _onDisposed(): void {
    this._widget = null;
    const next = this._front();
    this._follow(next && !next.isDisposed ? next : null);
    this._read();
  }

  private _front: () => Widget | null;
  private _widget: SessionWidget | null = null;
  private _current: ICurrent = {
    kernelId: null,
    path: null,
    hasSession: false
  };
  private _changed = new Signal<this, void>(this);
}
