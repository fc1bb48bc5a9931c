// Types for root-guard.mjs (the runner stays plain JS so it needs no build).
export type Snapshot = Record<string, string[]>;
export interface SourceDiff {
  source: string;
  added: string[];
  removed: string[];
}
export interface Source {
  name: string;
  cmd?: string[];
  dir?: string;
  normalise?: (text: string) => string[];
}
export const SOURCES: Source[];
export function lines(text: string): string[];
export function normaliseLinks(text: string): string[];
export function normaliseAddrs(text: string): string[];
export function normaliseRoutes(text: string): string[];
export function normaliseIptables(text: string): string[];
export function normaliseNft(text: string): string[];
export function listTree(dir: string): string[];
export function snapshot(sources?: Source[]): Snapshot;
export function diffSnapshots(before: Snapshot, after: Snapshot): SourceDiff[];
export function formatDiff(diff: SourceDiff[]): string;
