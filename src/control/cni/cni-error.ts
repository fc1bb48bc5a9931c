/**
 * CNI errors: what the plugin prints on stdout when a command fails, with a non-zero exit.
 *
 *   {"cniVersion":"1.0.0","code":7,"msg":"delegate: must not have a 'name' field ...","details":"..."}
 *
 * Codes 1-11 are the CNI spec's (SPEC.md "Error codes"); 100 and up are this plugin's own.
 * A CniError is also a WeftError (code WEFT_ERR_CNI) so logs carry the usual stable code.
 */
import { WeftError } from '../../common/errors.js';

export const CNI_ERR = {
  /** the config's cniVersion is not one this plugin speaks (or CHECK before 0.4.0) */
  INCOMPATIBLE_VERSION: 1,
  UNSUPPORTED_FIELD: 2,
  /** CHECK for a container this node never ADDed */
  UNKNOWN_CONTAINER: 3,
  /** CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS, CNI_PATH missing or invalid */
  INVALID_ENV: 4,
  /** the cache under dataDir or stdin could not be read or written */
  IO_FAILURE: 5,
  /** stdin (or a delegate's answer) is not JSON */
  DECODING_FAILURE: 6,
  /** a config field breaks a rule; the message names the field */
  INVALID_CONFIG: 7,
  /** subnet.env is missing or incomplete: the daemon has not written it yet */
  TRY_AGAIN_LATER: 11,
  /** the delegate plugin is not in any CNI_PATH directory */
  DELEGATE_NOT_FOUND: 100,
  /** the delegate crashed, or exited non-zero without a CNI error on stdout */
  DELEGATE_FAILED: 101,
  /** subnet.env exists but a value in it cannot be parsed */
  SUBNET_ENV_INVALID: 102,
  /** bin/weft-cni cannot find the weft package (dist/) it runs; see the comment in that file */
  PACKAGE_NOT_FOUND: 103,
  INTERNAL: 999,
} as const;

export class CniError extends WeftError {
  readonly cniCode: number;
  readonly cniDetails: string;

  constructor(cniCode: number, msg: string, details = '', options: { cause?: unknown } = {}) {
    super('WEFT_ERR_CNI', msg, { ...options, details: { cniCode } });
    this.name = 'CniError';
    this.cniCode = cniCode;
    this.cniDetails = details;
  }

  /** The spec's error object; `details` is left out when empty (as libcni does). */
  toResult(cniVersion: string): Record<string, unknown> {
    const out: Record<string, unknown> = { cniVersion, code: this.cniCode, msg: this.message };
    if (this.cniDetails) out.details = this.cniDetails;
    return out;
  }
}

export function isCniError(err: unknown): err is CniError {
  return err instanceof CniError;
}
