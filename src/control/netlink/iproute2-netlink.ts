/**
 * Netlink over iproute2's `ip` and `bridge` commands: the implementation used when the native
 * addon does not load (openNetlink() in open-netlink.ts picks it). Slower than NativeNetlink
 * (a process per batch, more on failures) but the same contract (netlink.ts), so the backends
 * cannot tell them apart.
 *
 * - Lists parse `ip -json` / `bridge -json` output.
 * - `apply` cuts the ops into segments at device ops (addVxlan, setLink, delLink); within a
 *   segment the `ip` ops run first as one `ip -force -batch -`, then the FDB ops as one
 *   `bridge -force -batch -` (neighbours, routes, addresses and FDB entries of existing
 *   devices do not depend on each other, so only device ops keep their place). When a batch
 *   fails, its ops are re-run one by one (all of them are idempotent) to learn each result: `ip`
 *   may stop a batch at the first failure and does not say which op failed beyond a line number.
 * - Errors: iproute2 prints the kernel's errno as strerror text ("RTNETLINK answers: File
 *   exists") or the kernel's extended ack ("Error: FIB table does not exist."); both are mapped
 *   back to the errno (ERRNO_TEXT, EXTACK_ERRNO), unknown messages to EINVAL, with ip's text in
 *   the error's details. Then `isAlreadyDone`/`netlinkError` apply as for the native one.
 *
 * `netns`: a namespace name, for tests (`ip -n`); the daemon runs in its node's namespace.
 */
import { execFile } from 'node:child_process';
import { constants } from 'node:os';
import { WeftError } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import {
  type AddrEntry,
  type FdbEntry,
  type LinkInfo,
  type NeighEntry,
  type Netlink,
  type Op,
  type RouteEntry,
  type RouteFilter,
  NUD_PERMANENT,
  RT_TABLE_MAIN,
  describeOp,
  errnoName,
  isAlreadyDone,
} from './netlink.js';

const E = constants.errno;

/** strerror(3) text (glibc) → errno, for the errnos rtnetlink returns. */
const ERRNO_TEXT: ReadonlyMap<string, number> = new Map([
  ['Operation not permitted', E.EPERM],
  ['No such file or directory', E.ENOENT],
  ['No such process', E.ESRCH],
  ['Input/output error', E.EIO],
  ['Permission denied', E.EACCES],
  ['Device or resource busy', E.EBUSY],
  ['File exists', E.EEXIST],
  ['No such device', E.ENODEV],
  ['Invalid argument', E.EINVAL],
  ['Numerical result out of range', E.ERANGE],
  ['No buffer space available', E.ENOBUFS],
  ['Operation not supported', E.EOPNOTSUPP],
  ['Address family not supported by protocol', E.EAFNOSUPPORT],
  ['Address already in use', E.EADDRINUSE],
  ['Cannot assign requested address', E.EADDRNOTAVAIL],
  ['Network is down', E.ENETDOWN],
  ['Network is unreachable', E.ENETUNREACH],
  ['No route to host', E.EHOSTUNREACH],
  ['Protocol not supported', E.EPROTONOSUPPORT],
]);

/** Kernel extended-ack messages that stand for an errno other than EINVAL. */
const EXTACK_ERRNO: ReadonlyArray<readonly [RegExp, number]> = [
  [/FIB table does not exist/, E.ESRCH],
  [/Device does not exist|Cannot find device|does not exist\.?$/, E.ENODEV],
  [/address not found/i, E.EADDRNOTAVAIL],
  [/Nexthop has invalid gateway/, E.ENETUNREACH],
  [/Nexthop device is not up/, E.ENETDOWN],
  [/Unknown device type/, E.EOPNOTSUPP],
  [/already exists/, E.EEXIST],
];

/** The errno an iproute2 failure message stands for (EINVAL when it does not say). */
export function errnoFromIpText(text: string): number {
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const ans = /^RTNETLINK answers: (.+?)\.?$/.exec(line);
    if (ans) return ERRNO_TEXT.get(ans[1]!) ?? E.EINVAL;
    if (/^Cannot find device |^Device ".*" does not exist/.test(line)) return E.ENODEV;
    if (line.startsWith('Error: ')) {
      const hit = EXTACK_ERRNO.find(([re]) => re.test(line));
      return hit ? hit[1] : E.EINVAL;
    }
  }
  return E.EINVAL;
}

type Tool = 'ip' | 'bridge';

interface RunResult {
  readonly ok: boolean;
  readonly stdout: string;
  readonly stderr: string;
}

/** NUD_* names as `ip neigh` prints them. */
const NUD_BITS: Readonly<Record<string, number>> = {
  INCOMPLETE: 0x01,
  REACHABLE: 0x02,
  STALE: 0x04,
  DELAY: 0x08,
  PROBE: 0x10,
  FAILED: 0x20,
  NOARP: 0x40,
  PERMANENT: NUD_PERMANENT,
  NONE: 0x00,
};

/** `bridge fdb` state words (an entry printed without one is NUD_REACHABLE). */
const FDB_STATE: Readonly<Record<string, number>> = {
  permanent: NUD_PERMANENT,
  static: 0x40,
  stale: 0x04,
  '': 0x02,
};

function familyFlag(addrOrCIDR: string): '-4' | '-6' {
  return addrOrCIDR.includes(':') ? '-6' : '-4';
}

/** The command line (without the tool name) for one op. */
export function opArgs(op: Op): { tool: Tool; args: string[] } {
  switch (op.op) {
    case 'replaceRoute':
    case 'delRoute': {
      const blackhole = op.type === 'blackhole';
      const verb = op.op === 'delRoute' ? 'del' : blackhole ? 'add' : 'replace';
      const args = [familyFlag(op.dst), 'route', verb];
      if (blackhole) args.push('blackhole');
      args.push(op.dst);
      if (op.gw) args.push('via', op.gw);
      if (op.dev) args.push('dev', op.dev);
      if (op.onlink) args.push('onlink');
      args.push('table', String(op.table ?? RT_TABLE_MAIN));
      return { tool: 'ip', args };
    }
    case 'replaceNeigh':
      return {
        tool: 'ip',
        args: [
          'neigh',
          'replace',
          op.dst,
          'lladdr',
          op.mac ?? '',
          'dev',
          op.dev,
          'nud',
          'permanent',
        ],
      };
    case 'delNeigh':
      return { tool: 'ip', args: ['neigh', 'del', op.dst, 'dev', op.dev] };
    case 'appendFdb':
      return {
        tool: 'bridge',
        args: ['fdb', 'append', op.mac, 'dst', op.dst, 'dev', op.dev, 'self', 'permanent'],
      };
    case 'delFdb':
      return { tool: 'bridge', args: ['fdb', 'del', op.mac, 'dst', op.dst, 'dev', op.dev, 'self'] };
    case 'replaceAddr':
    case 'delAddr':
      return {
        tool: 'ip',
        args: [
          familyFlag(op.addr),
          'addr',
          op.op === 'replaceAddr' ? 'replace' : 'del',
          op.addr,
          'dev',
          op.dev,
        ],
      };
    case 'setLink': {
      const args = ['link', 'set', 'dev', op.dev];
      if (op.mtu !== undefined) args.push('mtu', String(op.mtu));
      if (op.mac !== undefined) args.push('address', op.mac);
      if (op.up !== undefined) args.push(op.up ? 'up' : 'down');
      return { tool: 'ip', args };
    }
    case 'delLink':
      return { tool: 'ip', args: ['link', 'del', 'dev', op.dev] };
    case 'addIpip': {
      const args = ['link', 'add', op.name];
      if (op.mtu) args.push('mtu', String(op.mtu));
      args.push('type', 'ipip');
      if (op.local) args.push('local', op.local);
      args.push('ttl', 'inherit', 'tos', '0', 'nopmtudisc');
      return { tool: 'ip', args };
    }
    case 'addVxlan': {
      const args = ['link', 'add', op.name];
      if (op.mtu) args.push('mtu', String(op.mtu));
      if (op.mac) args.push('address', op.mac);
      args.push('type', 'vxlan', 'id', String(op.vni), 'dstport', String(op.port));
      if (op.local) args.push('local', op.local);
      if (op.link) args.push('dev', op.link);
      args.push(op.learning ? 'learning' : 'nolearning');
      if (op.gbp) args.push('gbp');
      return { tool: 'ip', args };
    }
  }
}

function isDeviceOp(op: Op): boolean {
  return op.op === 'addVxlan' || op.op === 'addIpip' || op.op === 'setLink' || op.op === 'delLink';
}

interface IpRoute {
  dst: string;
  gateway?: string;
  dev?: string;
  type?: string;
  protocol?: string;
  scope?: string;
  table?: string;
  flags?: string[];
}
interface IpNeigh {
  dst?: string;
  lladdr?: string;
  state?: string[];
}
interface IpFdb {
  mac?: string;
  dst?: string;
  flags?: string[];
  state?: string;
}
interface IpAddr {
  addr_info?: Array<{ family: string; local: string; prefixlen: number }>;
}
interface IpLink {
  ifindex: number;
  ifname: string;
  mtu: number;
  /** The bridge (or bond) it is a port of, by name. */
  master?: string;
  address?: string;
  flags?: string[];
  linkinfo?: {
    info_kind?: string;
    info_data?: {
      id?: number;
      port?: number;
      local?: string;
      local6?: string;
      link?: string;
      learning?: boolean;
      gbp?: boolean;
      remote?: string;
      ttl?: number;
      tos?: string | number;
      pmtudisc?: boolean;
      // tun
      type?: string;
      pi?: boolean;
      vnet_hdr?: boolean;
      multi_queue?: boolean;
      persist?: boolean;
      numqueues?: number;
    };
  };
}

const SCOPES: Readonly<Record<string, number>> = {
  universe: 0,
  global: 0,
  site: 200,
  link: 253,
  host: 254,
  nowhere: 255,
};

export class Iproute2Netlink implements Netlink {
  readonly #netns: string | undefined;
  #closed = false;

  constructor(options: { netns?: string } = {}) {
    this.#netns = options.netns;
  }

  #run(tool: Tool, args: readonly string[], input?: string): Promise<RunResult> {
    if (this.#closed) throw new WeftError('WEFT_ERR_NETLINK', 'netlink: used after close');
    const argv = this.#netns === undefined ? [...args] : ['-n', this.#netns, ...args];
    return new Promise((resolve, reject) => {
      const child = execFile(
        tool,
        argv,
        { encoding: 'utf8', maxBuffer: 256 << 20, timeout: 60_000 },
        (err, stdout, stderr) => {
          const code = (err as NodeJS.ErrnoException | null)?.code;
          if (code === 'ENOENT') {
            reject(
              new WeftError('WEFT_ERR_NETLINK', `${tool}: not found (install iproute2)`, {
                cause: err,
              }),
            );
          } else if (err && typeof code !== 'number' && err.killed) {
            reject(new WeftError('WEFT_ERR_NETLINK', `${tool} ${argv.join(' ')}: timed out`));
          } else if (typeof code === 'string') {
            // It never ran (EMFILE, EAGAIN, ...): an error of ours, not the command's answer.
            reject(
              new WeftError('WEFT_ERR_NETLINK', `${tool} ${argv.join(' ')}: cannot run: ${code}`, {
                cause: err,
              }),
            );
          } else {
            resolve({ ok: !err, stdout, stderr });
          }
        },
      );
      // A spawn that failed (EMFILE) has no stdio; its error comes through the callback above.
      if (input !== undefined) child.stdin?.end(input);
    });
  }

  async #json<T>(tool: Tool, args: readonly string[], what: string): Promise<T[] | null> {
    const r = await this.#run(tool, ['-json', ...args]);
    if (!r.ok) {
      if (errnoFromIpText(r.stderr) === E.ENODEV) return null;
      throw new WeftError('WEFT_ERR_NETLINK', `list ${what}: ${r.stderr.trim()}`);
    }
    const text = r.stdout.trim();
    if (text === '') return [];
    try {
      return JSON.parse(text) as T[];
    } catch (err) {
      throw new WeftError('WEFT_ERR_NETLINK', `list ${what}: unreadable ${tool} -json output`, {
        cause: err,
      });
    }
  }

  /** One op on its own: null, or its WEFT_ERR_NETLINK. */
  async #one(op: Op): Promise<WeftError | null> {
    const { tool, args } = opArgs(op);
    const r = await this.#run(tool, args);
    if (r.ok) return null;
    const errno = errnoFromIpText(r.stderr);
    if (isAlreadyDone(op, errno)) return null;
    const name = errnoName(errno);
    return new WeftError('WEFT_ERR_NETLINK', `${describeOp(op)}: ${name}`, {
      details: { op: op.op, errno: name, ip: r.stderr.trim() },
    });
  }

  /** Ops of one tool as one batch; one by one when the batch fails. */
  async #batch(ops: readonly Op[], idx: readonly number[], results: Array<WeftError | null>) {
    if (idx.length === 0) return;
    const cmds = idx.map((i) => opArgs(ops[i]!));
    // A batch line is split on blanks: an argument that is empty or holds one runs alone.
    if (idx.length > 1 && cmds.every((c) => c.args.every((a) => /^\S+$/.test(a)))) {
      const r = await this.#run(
        cmds[0]!.tool,
        ['-force', '-batch', '-'],
        cmds.map((c) => c.args.join(' ') + '\n').join(''),
      );
      if (r.ok) return;
    }
    for (const i of idx) results[i] = await this.#one(ops[i]!);
  }

  async apply(ops: readonly Op[]): Promise<Array<WeftError | null>> {
    const results = new Array<WeftError | null>(ops.length).fill(null);
    let i = 0;
    while (i < ops.length) {
      if (isDeviceOp(ops[i]!)) {
        results[i] = await this.#one(ops[i]!);
        i++;
        continue;
      }
      const ipOps: number[] = [];
      const fdbOps: number[] = [];
      for (; i < ops.length && !isDeviceOp(ops[i]!); i++) {
        (opArgs(ops[i]!).tool === 'ip' ? ipOps : fdbOps).push(i);
      }
      await this.#batch(ops, ipOps, results);
      await this.#batch(ops, fdbOps, results);
    }
    return results;
  }

  async listRoutes(filter: RouteFilter): Promise<RouteEntry[]> {
    const table = filter.table ?? RT_TABLE_MAIN;
    const fam = filter.family === 4 ? '-4' : '-6';
    const rows =
      (await this.#json<IpRoute>(
        'ip',
        ['-d', '-N', fam, 'route', 'show', 'table', String(table)],
        'route',
      )) ?? [];
    const host = filter.family === 4 ? 32 : 128;
    const out: RouteEntry[] = [];
    for (const r of rows) {
      // -N prints the type as a number (RTN_UNICAST = 1).
      if (r.type !== undefined && r.type !== '1' && r.type !== 'unicast') continue;
      let dst = r.dst === 'default' ? (filter.family === 4 ? '0.0.0.0/0' : '::/0') : r.dst;
      if (!dst.includes('/')) dst += `/${host}`;
      const dev = r.dev ?? null;
      if (filter.dst !== undefined && filter.dst !== dst) continue;
      if (filter.dev !== undefined && filter.dev !== dev) continue;
      out.push({
        dst,
        gw: r.gateway ?? null,
        dev,
        onlink: r.flags?.includes('onlink') ?? false,
        table,
        protocol: r.protocol === undefined ? 3 : Number(r.protocol),
        scope: r.scope === undefined ? 0 : (SCOPES[r.scope] ?? Number(r.scope)),
      });
    }
    return out;
  }

  async listNeighs(family: Family, dev: string): Promise<NeighEntry[]> {
    const fam = family === 4 ? '-4' : '-6';
    const rows = await this.#json<IpNeigh>(
      'ip',
      [fam, 'neigh', 'show', 'dev', dev, 'nud', 'all'],
      'neigh',
    );
    return (rows ?? [])
      .filter((n) => n.dst !== undefined)
      .map((n) => ({
        dst: n.dst!,
        dev,
        mac: n.lladdr ?? null,
        state: (n.state ?? []).reduce((s, w) => s | (NUD_BITS[w] ?? 0), 0),
      }));
  }

  async listFdb(dev: string): Promise<FdbEntry[]> {
    const rows = await this.#json<IpFdb>('bridge', ['fdb', 'show', 'dev', dev], 'fdb');
    return (rows ?? [])
      .filter((f) => f.mac !== undefined && (f.flags ?? []).includes('self'))
      .map((f) => ({
        mac: f.mac!,
        dst: f.dst ?? null,
        dev,
        state: FDB_STATE[f.state ?? ''] ?? 0,
      }));
  }

  async listAddrs(family: Family, dev: string): Promise<AddrEntry[]> {
    const fam = family === 4 ? '-4' : '-6';
    const rows = await this.#json<IpAddr>('ip', [fam, 'addr', 'show', 'dev', dev], 'addr');
    const want = family === 4 ? 'inet' : 'inet6';
    return (rows ?? []).flatMap((l) =>
      (l.addr_info ?? [])
        .filter((a) => a.family === want)
        .map((a) => ({ addr: `${a.local}/${a.prefixlen}`, dev })),
    );
  }

  async getLink(name: string): Promise<LinkInfo | null> {
    const rows = await this.#json<IpLink>('ip', ['-d', 'link', 'show', 'dev', name], 'link');
    const l = rows?.[0];
    if (!l) return null;
    const data = l.linkinfo?.info_data;
    const kind = l.linkinfo?.info_kind ?? '';
    let vxlan: LinkInfo['vxlan'] = null;
    if (kind === 'vxlan' && data) {
      let link = 0;
      if (data.link !== undefined) {
        const under = await this.#json<IpLink>('ip', ['link', 'show', 'dev', data.link], 'link');
        link = under?.[0]?.ifindex ?? 0;
      }
      vxlan = {
        vni: data.id ?? 0,
        port: data.port ?? 0,
        local: data.local ?? data.local6 ?? null,
        link,
        learning: data.learning ?? true,
        gbp: data.gbp ?? false,
      };
    }
    const ipip: LinkInfo['ipip'] =
      kind === 'ipip' && data
        ? {
            local: data.local && data.local !== 'any' ? data.local : null,
            remote: data.remote && data.remote !== 'any' ? data.remote : null,
            ttl: data.ttl ?? 0,
            tos:
              typeof data.tos === 'number' ? data.tos : Number.parseInt(data.tos ?? '0', 16) || 0,
            pmtudisc: data.pmtudisc ?? true,
          }
        : null;
    let master = 0;
    if (l.master !== undefined) {
      const m = await this.#json<IpLink>('ip', ['link', 'show', 'dev', l.master], 'link');
      master = m?.[0]?.ifindex ?? 0;
    }
    const tun: LinkInfo['tun'] =
      kind === 'tun' && data
        ? {
            type: data.type === 'tap' ? 'tap' : 'tun',
            pi: data.pi ?? true,
            vnetHdr: data.vnet_hdr ?? false,
            multiQueue: data.multi_queue ?? false,
            persist: data.persist ?? false,
            queues: data.numqueues ?? 0,
          }
        : null;
    return {
      index: l.ifindex,
      name: l.ifname,
      mtu: l.mtu,
      mac: l.address ?? null,
      up: l.flags?.includes('UP') ?? false,
      master,
      kind,
      vxlan,
      ipip,
      tun,
    };
  }

  close(): void {
    this.#closed = true;
  }
}
