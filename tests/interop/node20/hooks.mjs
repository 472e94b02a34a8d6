// Resolution hook (see register.mjs): `fs` / `node:fs` imported by a module of
// @modelcontextprotocol/conformance (or its 2026-07-28 alpha, installed under the alias
// conformance-2026-07-28) resolves to fs-globsync.mjs; everything else passes.
const SHIM = new URL('./fs-globsync.mjs', import.meta.url).href;
const PACKAGES = ['/@modelcontextprotocol/conformance/', '/conformance-2026-07-28/'];

export async function resolve(specifier, context, nextResolve) {
  if (
    (specifier === 'fs' || specifier === 'node:fs') &&
    context.parentURL !== undefined &&
    PACKAGES.some((p) => context.parentURL.includes(p))
  ) {
    return { url: SHIM, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
