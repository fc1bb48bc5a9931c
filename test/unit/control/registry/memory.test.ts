import { MemoryRegistry } from '../../../../src/control/registry/memory.js';
import { registryConformance } from '../../../helpers/registry-conformance.js';

registryConformance('memory', {
  open: async () => {
    const registry = new MemoryRegistry();
    return {
      registry,
      reserve: async (key, value) => registry.putRaw(key, value, null),
    };
  },
  shortTtlMs: 300,
  expirySlackMs: 100,
  expirationToleranceMs: 50,
});
