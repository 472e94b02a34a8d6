// Resolution hook (see register.mjs): `fs` / `node:fs` imported by a module of
// @modelcontextprotocol/conformance resolves to fs-globsync.mjs; everything else passes.
const SHIM = new URL('./fs-globsync.mjs', import.meta.url).href;
const PACKAGE = '/@modelcontextprotocol/conformance/';

export async function resolve(specifier, context, nextResolve) {
  if (
    (specifier === 'fs' || specifier === 'node:fs') &&
    context.parentURL !== undefined &&
    context.parentURL.includes(PACKAGE)
  ) {
    return { url: SHIM, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
