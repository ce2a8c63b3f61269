/* placeholder: not implemented yet */
int main(void) { return 1; }
