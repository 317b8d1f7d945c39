"""Arrays: DeviceBuffer and DeviceArray, HostArray, share() (src/arrays/)."""
