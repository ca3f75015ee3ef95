// Typeset the maths that pymdownx.arithmatex (generic mode) leaves as \( ... \) and \[ ... \],
// with the KaTeX copy bundled in docs/assets/katex: no network access is needed to read the
// site. document$ is Material's page observable, so instant navigation typesets new pages too.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "$", right: "$", display: false },
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});
