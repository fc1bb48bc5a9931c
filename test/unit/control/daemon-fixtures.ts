/**
 * A daemon configuration for tests that run `runDaemon` in-process: a memory store through
 * LocalManager, the fixture interface, no HTTP endpoint, subnet.env under `dir`.
 */
import { join } from 'node:path';
import { DEFAULT_BACKEND_OPTIONS } from '../../../src/control/backend/backend.js';
import type { DaemonConfig } from '../../../src/control/daemon.js';
import { LocalManager } from '../../../src/control/lease/local-manager.js';
import type { MemoryRegistry } from '../../../src/control/registry/memory.js';
import { EXT } from './backend/fixtures.js';

export function testDaemonConfig(
  dir: string,
  reg: MemoryRegistry,
  extra: Partial<DaemonConfig> = {},
): DaemonConfig {
  return {
    subnetFile: join(dir, 'subnet.env'),
    renewMarginMs: 60_000,
    healthzIp: '127.0.0.1',
    healthzPort: 0,
    releaseLeaseOnExit: false,
    ipMasq: false,
    backendOptions: DEFAULT_BACKEND_OPTIONS,
    openManager: async () => new LocalManager(reg),
    selectInterface: async () => EXT,
    ...extra,
  };
}
