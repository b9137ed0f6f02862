import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ISessionContext,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { KernelAPI } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { formatMiB, parseSize } from './format';
import { gpuIcon } from './icon';
import { DEFAULT_SETTINGS, GpuShareModel, ISettings } from './model';
import { notifyEvents } from './notify';
import { GpuSharePanel, IPanelActions } from './panel';
import type { IKernel } from './types';

const PLUGIN_ID = 'jupyter-gpushare:plugin';
/** localStorage key: the "This host" section was left open (per browser). */
const HOST_OPEN_KEY = 'jupyter-gpushare:host-open';

function remembered(key: string): boolean {
  try {
    return window.localStorage.getItem(key) === 'true';
  } catch {
    return false; // storage disabled: start closed
  }
}

function remember(key: string, value: boolean): void {
  try {
    window.localStorage.setItem(key, String(value));
  } catch {
    // storage disabled or full: the section just starts closed next time
  }
}

namespace CommandIDs {
  export const open = 'gpushare:open-panel';
  export const refresh = 'gpushare:refresh';
  export const bench = 'gpushare:bench-render';
}

/** A widget that can run a kernel (notebook, console). */
type SessionWidget = Widget & { sessionContext: ISessionContext };

function hasSession(w: Widget | null | undefined): w is SessionWidget {
  return !!w && !!(w as any).sessionContext;
}

/** The dialog body that asks for a new quota. */
class QuotaBody extends Widget implements Dialog.IBodyWidget<string> {
  constructor(kernel: IKernel, maxText: string) {
    super();
    this.addClass('jp-gpushare-quota-dialog');
    const p = document.createElement('p');
    p.textContent =
      `Current quota: ${kernel.quota ?? '–'}. ${maxText} ` +
      'The kernel restarts to apply the new quota: its variables and state will be lost. ' +
      'If the GPU has no room, it waits in line.';
    this.input = document.createElement('input');
    this.input.className = 'jp-mod-styled jp-gpushare-quota-input';
    this.input.value = kernel.pending_quota ?? kernel.quota ?? '';
    this.input.placeholder = 'e.g. 6GiB or 512MiB';
    this.input.setAttribute('aria-label', 'New GPU memory quota');
    this.node.append(p, this.input);
  }
  getValue(): string {
    return this.input.value.trim();
  }
  protected onAfterAttach(): void {
    this.input.focus();
    this.input.select();
  }
  readonly input: HTMLInputElement;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Right sidebar and status bar item showing each kernel’s GPU memory quota and use.',
  autoStart: true,
  optional: [ILabShell, INotebookTracker, IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    notebooks: INotebookTracker | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const { serviceManager, commands, shell } = app;
    const serverSettings = serviceManager.serverSettings;
    const model = new GpuShareModel(serverSettings);
    model.hostOpen = remembered(HOST_OPEN_KEY);

    // -- sessions: kernel id → notebook path (relative to the server root) -----------
    const sessionPath = new Map<string, string>();
    const readSessions = () => {
      sessionPath.clear();
      for (const s of serviceManager.sessions.running()) {
        if (s.kernel?.id) {
          sessionPath.set(s.kernel.id, s.path);
        }
      }
    };
    serviceManager.sessions.runningChanged.connect(() => {
      readSessions();
      void model.refresh();
    });
    readSessions();

    const serverRoot = (PageConfig.getOption('serverRoot') || '').replace(
      /\\/g,
      '/'
    );
    const pathOfKernel = (k: IKernel): string | null => {
      const known = sessionPath.get(k.kernel_id);
      if (known) {
        return known;
      }
      if (!k.path) {
        return null;
      }
      const p = k.path.replace(/\\/g, '/');
      if (serverRoot && p.startsWith(serverRoot + '/')) {
        return p.slice(serverRoot.length + 1);
      }
      return p.startsWith('/') ? null : p;
    };

    // -- the widget in front ------------------------------------------------------------
    let currentWidget: SessionWidget | null = null;
    const readCurrent = () => {
      const ctx = currentWidget?.sessionContext;
      model.setCurrent({
        kernelId: ctx?.session?.kernel?.id ?? null,
        path: ctx?.path ?? null,
        hasSession: !!ctx
      });
    };
    const follow = (w: Widget | null) => {
      if (w === currentWidget || (w && !hasSession(w))) {
        // Keep the last notebook when a non-notebook widget (panel, file browser) is focused.
        if (!w && currentWidget === null) {
          readCurrent();
        }
        return;
      }
      if (currentWidget) {
        currentWidget.sessionContext.kernelChanged.disconnect(readCurrent);
        currentWidget.sessionContext.sessionChanged.disconnect(readCurrent);
        currentWidget.disposed.disconnect(onDisposed);
      }
      currentWidget = w as SessionWidget | null;
      if (currentWidget) {
        currentWidget.sessionContext.kernelChanged.connect(readCurrent);
        currentWidget.sessionContext.sessionChanged.connect(readCurrent);
        currentWidget.disposed.connect(onDisposed);
      }
      readCurrent();
    };
    const onDisposed = () => {
      currentWidget = null;
      follow(
        (labShell?.currentWidget as Widget | null) ??
          notebooks?.currentWidget ??
          null
      );
      readCurrent();
    };
    if (labShell) {
      labShell.currentChanged.connect((_, args) => follow(args.newValue));
    }
    notebooks?.currentChanged.connect((_, w) => follow(w));
    follow(
      (labShell?.currentWidget as Widget | null) ??
        notebooks?.currentWidget ??
        null
    );

    // -- actions ---------------------------------------------------------------------------
    const findSessionWidget = (kernelId: string): SessionWidget | null => {
      let found: SessionWidget | null = null;
      notebooks?.forEach(w => {
        if (w.sessionContext.session?.kernel?.id === kernelId) {
          found = w;
        }
      });
      return found;
    };

    const restart = async (k: IKernel) => {
      const w = findSessionWidget(k.kernel_id);
      const kernel = w?.sessionContext.session?.kernel;
      if (kernel) {
        await kernel.restart();
      } else {
        await KernelAPI.restartKernel(k.kernel_id, serverSettings);
      }
    };

    const actions: IPanelActions = {
      pathOf: pathOfKernel,
      refresh: () => void model.refresh(),
      toggleHost: () => {
        model.hostOpen = !model.hostOpen;
        remember(HOST_OPEN_KEY, model.hostOpen);
      },
      open: k => {
        const path = pathOfKernel(k);
        if (path) {
          void commands.execute('docmanager:open', { path });
        }
      },
      changeQuota: async k => {
        const cfg = model.snapshot.config;
        const cardTotal = k.card?.total_mib;
        const maxMiB = cfg?.max_quota
          ? parseSize(cfg.max_quota, cardTotal)
          : null;
        const maxText = cfg?.max_quota
          ? `The admin allows at most ${cfg.max_quota}${maxMiB !== null && cfg.max_quota.includes('%') ? ` (${formatMiB(maxMiB)})` : ''}.`
          : '';
        const result = await showDialog({
          title: `GPU quota of ${pathOfKernel(k) ?? k.kernel_name}`,
          body: new QuotaBody(k, maxText),
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: 'Restart with new quota' })
          ],
          focusNodeSelector: 'input'
        });
        if (!result.button.accept || !result.value) {
          return;
        }
        const mib = parseSize(result.value, cardTotal);
        if (mib === null || mib <= 0) {
          void showErrorMessage(
            'Not a size',
            `“${result.value}” is not a GPU memory size. Write e.g. 6GiB, 512MiB or 4G.`
          );
          return;
        }
        if (maxMiB !== null && mib > maxMiB) {
          void showErrorMessage(
            'Quota too large',
            `${result.value} is more than the admin’s maximum of ${cfg?.max_quota}.`
          );
          return;
        }
        try {
          await model.requestQuota(k.kernel_id, result.value);
        } catch (e) {
          void showErrorMessage('Quota not changed', (e as Error).message);
          return;
        }
        Notification.info(
          `Restarting ${pathOfKernel(k) ?? 'the kernel'} with a ${result.value} GPU quota…`,
          { autoClose: 5000 }
        );
        restart(k)
          .then(() => model.refresh())
          .catch(e =>
            Notification.error(`Restart failed: ${(e as Error).message ?? e}`, {
              autoClose: false
            })
          );
        void model.refresh();
      },
      shutdown: async k => {
        const name = pathOfKernel(k) ?? `kernel ${k.kernel_id.slice(0, 8)}`;
        const result = await showDialog({
          title: 'Shut down kernel?',
          body: `Shut down the kernel of ${name}? Its variables and state will be lost, and its GPU memory goes back to the others.`,
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: 'Shut down' })
          ]
        });
        if (!result.button.accept) {
          return;
        }
        try {
          const session = [...serviceManager.sessions.running()].find(
            s => s.kernel?.id === k.kernel_id
          );
          if (session) {
            await serviceManager.sessions.shutdown(session.id);
          } else {
            await serviceManager.kernels.shutdown(k.kernel_id);
          }
        } catch (e) {
          void showErrorMessage('Shut down failed', (e as Error).message);
        }
        void model.refresh();
      },
      stopWaiting: async k => {
        try {
          await model.stopWaiting(k.kernel_id);
        } catch (e) {
          void showErrorMessage('Could not stop waiting', (e as Error).message);
        }
      }
    };

    // -- panel, status bar, notifications -------------------------------------------------
    const panel = new GpuSharePanel(model, actions);
    panel.id = 'jp-gpushare';
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPU memory quotas';
    shell.add(panel, 'right', { rank: 600 });

    commands.addCommand(CommandIDs.open, {
      label: 'Show GPU Memory Quotas',
      icon: gpuIcon,
      execute: () => {
        if (!panel.isAttached) {
          shell.add(panel, 'right', { rank: 600 });
        }
        shell.activateById(panel.id);
      }
    });
    commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh GPU Memory Quotas',
      execute: () => model.refresh()
    });
    // Render the panel with N synthetic kernels and return per-render times (ms).
    commands.addCommand(CommandIDs.bench, {
      label: 'Benchmark the GPU panel rendering',
      execute: args => {
        const n = Number(args.kernels ?? 50);
        const repeats = Number(args.repeats ?? 30);
        const base = model.snapshot;
        const card = base.cards?.cards[0] ?? {
          index: 0,
          uuid: 'GPU-bench',
          name: 'Bench card',
          total_mib: 81920,
          simulated: true,
          usable_mib: 81920,
          reserved_mib: 0,
          unreserved_mib: 81920,
          kernels: 0,
          allowed: true
        };
        const states = [
          'running',
          'near_quota',
          'over_quota',
          'idle',
          'queued',
          'cpu'
        ];
        const times: number[] = [];
        for (let r = 0; r < repeats; r++) {
          const kernels: IKernel[] = [];
          for (let i = 0; i < n; i++) {
            const state = states[i % states.length];
            const quota = 2048 + 512 * (i % 4);
            kernels.push({
              kernel_id: `bench-${i.toString().padStart(4, '0')}-0000-0000`,
              kernel_name: 'python3',
              language: 'python',
              user: 'student',
              path: `course/week${i % 10}/notebook-${i}.ipynb`,
              state,
              quota: formatMiB(quota),
              quota_mib: state === 'queued' || state === 'cpu' ? null : quota,
              reserve_mib: 512,
              reserved_mib: quota + 512,
              card: state === 'queued' || state === 'cpu' ? null : card,
              position: state === 'queued' ? 1 + (i % 5) : null,
              used_mib:
                state === 'running'
                  ? (i * 37 + r * 11) % quota
                  : state === 'near_quota'
                    ? quota * 0.95
                    : state === 'over_quota'
                      ? quota * 1.1
                      : 100,
              peak_mib: quota * 0.97,
              utilization: (i * 7 + r) % 100,
              frameworks: {
                torch: { capped: true, limit_mib: quota },
                jax: { capped: i % 2 === 0, detail: 'not imported' }
              },
              reason:
                state === 'cpu' ? 'No GPU has room for this kernel.' : null,
              since: i
            });
          }
          times.push(
            panel.renderNow({
              snapshot: {
                ...base,
                cards: base.cards ?? {
                  backend: 'simulated',
                  simulated: true,
                  cards: [card]
                },
                kernels,
                error: null
              },
              current: {
                kernelId: kernels[3].kernel_id,
                path: null,
                hasSession: true
              },
              settings: model.settings,
              hostOpen: false
            })
          );
        }
        panel.renderNow();
        // The first render builds the DOM from nothing; later ones are refreshes (a diff).
        const sorted = times.slice(1).sort((a, b) => a - b);
        return {
          kernels: n,
          repeats,
          median_ms: sorted[Math.floor(sorted.length / 2)],
          p95_ms:
            sorted[
              Math.min(sorted.length - 1, Math.floor(sorted.length * 0.95))
            ],
          max_ms: sorted[sorted.length - 1],
          first_ms: times[0],
          times
        };
      }
    });

    if (statusBar) {
      // Imported lazily so that Notebook 7 without a status bar pays nothing.
      void import('./status').then(({ GpuStatusItem }) => {
        const item = new GpuStatusItem(model, () =>
          commands.execute(CommandIDs.open)
        );
        statusBar.registerStatusItem('jupyter-gpushare:status', {
          item,
          align: 'left',
          rank: 3,
          isActive: () => item.available,
          activeStateChanged: model.changed
        });
      });
    }

    model.events.connect((_, events) => {
      if (model.settings.notifications) {
        notifyEvents(events, model.snapshot.kernels, id => {
          const k = model.snapshot.kernels.find(x => x.kernel_id === id);
          return sessionPath.get(id) ?? (k ? pathOfKernel(k) : null);
        });
      }
    });

    // -- settings --------------------------------------------------------------------------
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
  }
};

export default plugin;
