/**
 * The JupyterLab (and Notebook 7) plugins of jupyter-gpushare:
 *
 * - core: the state model (model.ts), the notebook in front (tracker.ts), the actions (actions.ts) and the
 *   notifications; the other plugins use it through IGpuShare;
 * - panel: the right sidebar, and its commands (command palette, View menu);
 * - status bar: the current notebook's use;
 * - notebooks: the queued banner in each notebook, and where there is no status bar (Notebook 7) an
 *   indicator in the notebook's toolbar.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { Token } from '@lumino/coreutils';

import {
  HOST_OPEN_KEY,
  IKernelActions,
  kernelActions,
  remembered
} from './actions';
import { QueuedBanner, ToolbarIndicator } from './banner';
import { HeldCellFollower } from './heldcell';
import { gpuIcon } from './icon';
import { DEFAULT_SETTINGS, GpuShareModel, ISettings } from './model';
import { explainInCell } from './explain';
import { Notifier } from './notify';
import { GpuSharePanel } from './panel';
import { KernelTracker } from './tracker';
import type { IKernel } from './types';
import { pseudoLocale, say, setTranslator } from './words';

const PLUGIN_ID = 'jupyter-gpushare:plugin';

export namespace CommandIDs {
  export const open = 'gpushare:open-panel';
  export const refresh = 'gpushare:refresh';
}

/** What the plugins share. */
export interface IGpuShare {
  model: GpuShareModel;
  tracker: KernelTracker;
  actions: IKernelActions;
}

export const IGpuShare = new Token<IGpuShare>(
  'jupyter-gpushare:core',
  'The GPU quota state, the notebook in front and the actions.'
);

const core: JupyterFrontEndPlugin<IGpuShare> = {
  id: PLUGIN_ID,
  description:
    'The GPU quota state of this server, the notebook in front, and notifications.',
  autoStart: true,
  provides: IGpuShare,
  optional: [ILabShell, INotebookTracker, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    notebooks: INotebookTracker | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ): IGpuShare => {
    const { serviceManager } = app;
    const trans = (translator ?? nullTranslator).load('jupyter_gpushare');
    setTranslator(pseudoLocale() ? pseudoLocale(trans) : trans);
    const model = new GpuShareModel(
      serviceManager.serverSettings,
      (serviceManager as any).events ?? null
    );
    model.hostOpen = remembered(HOST_OPEN_KEY);
    const tracker = new KernelTracker(model, labShell, notebooks);
    const actions = kernelActions(app, model, tracker);
    serviceManager.sessions.runningChanged.connect(() => void model.refresh());

    const known = (id: string, name: (k: IKernel) => string) => {
      const k = model.kernel(id);
      return k ? name(k) || null : null;
    };
    const notifier = new Notifier(
      id => known(id, actions.notebookOf),
      id => known(id, actions.nameOf)
    );
    model.events.connect((_, events) => {
      for (const e of events) {
        // why the server interrupted or restarted a kernel, said where its cell shows the KeyboardInterrupt
        const k = e.kernel_id ? model.kernel(e.kernel_id) : undefined;
        explainInCell(k ? tracker.widgetOf(k) : null, e);
      }
      if (model.settings.notifications) {
        notifier.show(
          events.map(e => ({
            ...e,
            path: model.kernel(e.kernel_id)?.path ?? e.path
          }))
        );
      }
    });
    const follow = () => {
      if (model.snapshot.state) {
        notifier.update(
          new Map(model.kernels.map(k => [k.kernel_id, k.status?.code ?? null]))
        );
      }
    };
    model.changed.connect(follow);
    serviceManager.sessions.runningChanged.connect(follow); // a rename

    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            model.settings = {
              ...DEFAULT_SETTINGS,
              ...(settings.composite as unknown as Partial<ISettings>)
            };
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason =>
          console.error(
            'jupyter-gpushare: settings could not be loaded',
            reason
          )
        );
    }
    return { model, tracker, actions };
  }
};

const panel: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:panel',
  description:
    'The right sidebar: cards, my kernels with their quotas and use, this host.',
  autoStart: true,
  requires: [IGpuShare],
  optional: [ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    gpu: IGpuShare,
    palette: ICommandPalette | null
  ) => {
    const { commands, shell } = app;
    const widget = new GpuSharePanel(gpu.model, gpu.tracker, gpu.actions);
    widget.id = 'jp-gpushare';
    widget.title.icon = gpuIcon;
    widget.title.caption = say('ui.caption');
    shell.add(widget, 'right', { rank: 600 });
    commands.addCommand(CommandIDs.open, {
      label: say('ui.cmd.open'),
      caption: say('ui.cmd.open_caption'),
      icon: gpuIcon,
      execute: () => {
        if (!widget.isAttached) {
          shell.add(widget, 'right', { rank: 600 });
        }
        shell.activateById(widget.id);
      }
    });
    commands.addCommand(CommandIDs.refresh, {
      label: say('ui.cmd.refresh'),
      execute: () => gpu.model.refresh()
    });
    palette?.addItem({ command: CommandIDs.open, category: 'GPU' });
    palette?.addItem({ command: CommandIDs.refresh, category: 'GPU' });
  }
};

const statusBar: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:status-bar',
  description:
    'The status bar item: the current notebook’s GPU use against its reservation (Notebook 7 has no status bar: the notebooks plugin puts it in the toolbar).',
  autoStart: true,
  requires: [IGpuShare],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, gpu: IGpuShare, bar: IStatusBar | null) => {
    if (!bar) {
      return;
    }
    void import('./statusbar').then(({ GpuStatusItem }) => {
      const item = new GpuStatusItem(
        gpu.model,
        gpu.tracker,
        () => void app.commands.execute(CommandIDs.open)
      );
      bar.registerStatusItem('jupyter-gpushare:status', {
        item,
        align: 'left',
        rank: 3,
        isActive: () => item.available,
        activeStateChanged: gpu.model.changed
      });
    });
  }
};

const notebooks: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:notebooks',
  description:
    'In each notebook: a banner while its kernel waits for a GPU; a waiting cell followed after a reload; a toolbar indicator without a status bar.',
  autoStart: true,
  requires: [IGpuShare, INotebookTracker],
  optional: [IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    gpu: IGpuShare,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null
  ) => {
    tracker.widgetAdded.connect((_, nb: NotebookPanel) => {
      nb.contentHeader.addWidget(
        new QueuedBanner(nb, gpu.model, gpu.tracker, gpu.actions)
      );
      new HeldCellFollower(nb, gpu.model, gpu.tracker); // (disposed with the notebook)
      if (!statusBar) {
        nb.toolbar.insertItem(
          10,
          'gpushare',
          new ToolbarIndicator(
            nb,
            gpu.model,
            gpu.tracker,
            () => void app.commands.execute(CommandIDs.open)
          )
        );
      }
    });
  }
};

export default [core, panel, statusBar, notebooks];
