// Node 20 support for @modelcontextprotocol/conformance (tests/test_conformance.py).
//
// The suite's dist/index.js does `import {globSync} from "fs"`, an API added in Node 22,
// so on Node 20 the module fails to link before doing anything. It only calls globSync
// for `**/checks.json` in its tier report, never on a `server` run. Loaded with
// `node --import tests/interop/node20/register.mjs ...`, this registers hooks.mjs, which
// gives the suite's modules (and only them) an `fs` that has a small globSync
// (fs-globsync.mjs). On Node >= 22 (a real fs.globSync) nothing is registered.
import fs from 'node:fs';
import { register } from 'node:module';

if (typeof fs.globSync !== 'function') {
  register('./hooks.mjs', import.meta.url);
}
