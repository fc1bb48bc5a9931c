/**
 * Opens the lease store the flags select (see config/flags.ts `storeKind`): the embedded
 * directory store (default), etcd (--etcd-endpoints) or the Kubernetes API (--kube-subnet-mgr).
 */
import { WeftError } from '../../common/errors.js';
import {
  storeKind,
  type StoreFlagTable,
  type ParsedFlags,
  type FlagTable,
  type FlagValues,
} from '../config/flags.js';
import type { Registry } from './registry.js';

type StoreValues = FlagValues<StoreFlagTable>;

/**
 * A Registry for the etcd or embedded store; the kube store is not a Registry (see
 * ../kube/kube-manager.ts).
 * Each store's module is imported only when selected.
 */
export async function openRegistry<T extends FlagTable>(
  parsed: ParsedFlags<T>,
  opts: { readOnly?: boolean } = {},
): Promise<Registry> {
  const v = parsed.values as unknown as StoreValues;
  const kind = storeKind({ values: v, explicit: parsed.explicit as ReadonlySet<string> });
  switch (kind) {
    case 'embedded':
      return new (await import('./embedded.js')).EmbeddedRegistry(v.storeDir, opts);
    case 'etcd': {
      const { EtcdRegistry } = await import('./etcd.js');
      return new EtcdRegistry({
        endpoints: v.etcdEndpoints
          .split(',')
          .map((s) => s.trim())
          .filter(Boolean),
        prefix: v.etcdPrefix,
        keyFile: v.etcdKeyfile || undefined,
        certFile: v.etcdCertfile || undefined,
        caFile: v.etcdCafile || undefined,
        username: v.etcdUsername || undefined,
        password: v.etcdPassword || undefined,
      });
    }
    case 'kube':
      throw new WeftError(
        'WEFT_ERR_USAGE',
        '--kube-subnet-mgr: the Kubernetes subnet manager keeps no raw lease store; use kubectl',
      );
  }
}
