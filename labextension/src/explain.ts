import type { ICodeCellModel } from '@jupyterlab/cells';
import type { Widget } from '@lumino/widgets';

import { say } from './words';
import type { IEvent } from './types';

/** What the server did to a kernel that a cell's output would otherwise show bare (a KeyboardInterrupt). */
const EXPLAINED = new Set(['over-quota-interrupt', 'over-quota-restart']);

/** The cells of an open notebook, as far as this module needs them. */
interface INotebookLike extends Widget {
  content: { widgets: ReadonlyArray<{ model: { type: string } }> };
}

function isNotebook(w: Widget | null): w is INotebookLike {
  return !!w && Array.isArray((w as any).content?.widgets);
}

/**
 * Say in the notebook why the server interrupted or restarted its kernel: a
 * stderr note, in the server's figures (what it used, its reservation, what to
 * do), on the cell that was running, or else the last one the interrupt ended
 * with a KeyboardInterrupt. False when there is no such cell (the notification
 * and the panel say it then).
 */
export function explainInCell(widget: Widget | null, e: IEvent): boolean {
  if (!EXPLAINED.has(e.kind) || !isNotebook(widget)) {
    return false;
  }
  const code = widget.content.widgets
    .map(c => c.model)
    .filter((m): m is ICodeCellModel => m.type === 'code') as ICodeCellModel[];
  const interrupted = (m: ICodeCellModel) => {
    for (let i = 0; i < m.outputs.length; i++) {
      const out = m.outputs.get(i).toJSON() as { ename?: string };
      if (out.ename === 'KeyboardInterrupt') {
        return true;
      }
    }
    return false;
  };
  const cell =
    code.find(m => m.executionState === 'running') ??
    code
      .filter(interrupted)
      .sort((a, b) => (b.executionCount ?? 0) - (a.executionCount ?? 0))[0];
  if (!cell) {
    return false;
  }
  cell.outputs.add({
    output_type: 'stream',
    name: 'stderr',
    text: `${say('ui.cell.gpu', {
      text: say(`event.${e.code ?? e.kind}`, {
        message: e.message,
        ...e.params
      })
    })}\n`
  });
  return true;
}
