// What the walk scripts (class-walk.js, idle-cost.js) ask of a page: its server's REST API, through the page's own
// fetch (its cookies and origin), as the page itself would ask.
const api = (page, p, init) =>
  page.evaluate(
    async ([p, init]) => {
      const r = await fetch(p, init);
      return r.status === 204 ? null : r.json();
    },
    [p, init]
  );

// A notebook of one code cell of ``source`` (its lines), saved at ``path`` through the page.
const putNotebook = (page, path, source) =>
  api(page, `/api/contents/${path}`, {
    method: 'PUT',
    body: JSON.stringify({
      type: 'notebook',
      format: 'json',
      content: {
        cells: [
          {
            cell_type: 'code',
            id: 'c1',
            metadata: {},
            outputs: [],
            execution_count: null,
            source
          }
        ],
        metadata: {
          kernelspec: {
            name: 'python3',
            display_name: 'Python 3 (ipykernel)',
            language: 'python'
          }
        },
        nbformat: 4,
        nbformat_minor: 5
      }
    })
  });

module.exports = { api, putNotebook };
