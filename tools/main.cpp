// PLACEHOLDER: owned by a helper; replaced by the real implementation.
int main() { return 0; }
