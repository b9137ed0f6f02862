import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm0 2v10h10V7H7z"/>
    <rect x="9" y="12" width="2" height="3"/><rect x="11.5" y="10" width="2" height="5"/><rect x="14" y="9" width="1.5" height="6" opacity=".5"/>
    <path d="M8 2h1.5v3H8zM11.25 2h1.5v3h-1.5zM14.5 2H16v3h-1.5zM8 19h1.5v3H8zM11.25 19h1.5v3h-1.5zM14.5 19H16v3h-1.5zM2 8h3v1.5H2zM2 11.25h3v1.5H2zM2 14.5h3V16H2zM19 8h3v1.5h-3zM19 11.25h3v1.5h-3zM19 14.5h3V16h-3z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({
  name: 'jupyter-gpushare:gpu',
  svgstr: svg
});
