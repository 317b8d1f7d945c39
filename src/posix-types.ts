// Types of the addon's POSIX functions (native/posix.cc).
export interface PosixAddon {}
